//! The one text form of descriptor entries that the admin API, the CLI and the page share: bytes
//! in, bytes out.
//!
//! A descriptor is `key=value,key2=value2`. In a key or a value every byte outside
//! `A-Z a-z 0-9 - . _ ~ : @ /` is written `%XX` (two hex digits, either case on input): `%FF` is
//! the byte 0xFF, `%2C` a `,` inside a value, `%3D` a `=`, `%25` a `%`, `%20` a space, `%C3%A9` an
//! `é`. The form is URL-safe, so it goes into a query (`descriptor=`, `bucket=`) as it is; what
//! `/top` prints, typed back, names the same bytes. Keys must decode to UTF-8. A `%` not followed
//! by two hex digits is an error, never a guess.

use crate::request::Entry;

/// Why a descriptor's text cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("empty descriptor")]
    Empty,
    #[error("entry {index}: `{text}` is not key=value")]
    NotAPair { index: usize, text: String },
    #[error("entry {index}: empty key")]
    EmptyKey { index: usize },
    #[error("entry {index}: the key is not UTF-8")]
    KeyNotUtf8 { index: usize },
    #[error("entry {index}: `%` at byte {at} is not followed by two hex digits (write % as %25)")]
    BadEscape { index: usize, at: usize },
}

/// Whether `byte` stands for itself in the text form.
fn plain(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-._~:@/".contains(&byte)
}

/// `bytes` in the text form.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if plain(b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `key=value,…` of `entries`, each key and value in the text form.
pub fn entries_text(entries: &[Entry]) -> String {
    let mut out = String::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&encode(entry.key.as_bytes()));
        out.push('=');
        out.push_str(&encode(entry.value.as_bytes()));
    }
    out
}

/// The bytes `text` names; `index` is the entry's, for the error.
fn decode(text: &[u8], index: usize) -> Result<Vec<u8>, TextError> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] != b'%' {
            out.push(text[i]);
            i += 1;
            continue;
        }
        let hex = |b: Option<&u8>| b.and_then(|b| char::from(*b).to_digit(16));
        match (hex(text.get(i + 1)), hex(text.get(i + 2))) {
            (Some(high), Some(low)) => out.push((high * 16 + low) as u8),
            _ => return Err(TextError::BadEscape { index, at: i }),
        }
        i += 3;
    }
    Ok(out)
}

/// The entries `text` (`key=value,…`) names, in order.
pub fn parse(text: &[u8]) -> Result<Vec<Entry>, TextError> {
    if text.is_empty() {
        return Err(TextError::Empty);
    }
    text.split(|b| *b == b',')
        .enumerate()
        .map(|(i, pair)| {
            let index = i + 1;
            let Some(eq) = pair.iter().position(|b| *b == b'=') else {
                let text = String::from_utf8_lossy(pair).into_owned();
                return Err(TextError::NotAPair { index, text });
            };
            let key = String::from_utf8(decode(&pair[..eq], index)?)
                .map_err(|_| TextError::KeyNotUtf8 { index })?;
            if key.is_empty() {
                return Err(TextError::EmptyKey { index });
            }
            Ok(Entry::new(key, decode(&pair[eq + 1..], index)?))
        })
        .collect()
}

/// A query parameter's value as sent (not decoded): the text form goes into a query unchanged.
/// A value with no literal `=` is read as a whole descriptor URL-encoded once more (what clients
/// before this form sent: `tenant%3Dacme`) and decoded first.
pub fn parse_query_value(raw: &str) -> Result<Vec<Entry>, TextError> {
    if raw.contains('=') {
        return parse(raw.as_bytes());
    }
    let once = decode(raw.as_bytes(), 0)?;
    parse(&once)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_string_round_trips() {
        let values: [&[u8]; 6] = [
            b"acme",
            b"\xFF\x00",
            b"a,b=c%d",
            "é ü+&#?".as_bytes(),
            b"",
            b"%FF",
        ];
        for value in values {
            let entries = vec![
                Entry::new("k,=", value.to_vec()),
                Entry::new("user", value.to_vec()),
            ];
            let text = entries_text(&entries);
            assert!(
                text.bytes().all(|b| plain(b) || b"%,=".contains(&b)),
                "{text}"
            );
            assert_eq!(parse(text.as_bytes()).unwrap(), entries, "{text}");
        }
    }

    #[test]
    fn percent_names_a_byte_and_nothing_else() {
        let entries = parse(b"tenant=%FF,route=a%2cb").unwrap();
        assert_eq!(entries[0].value.as_bytes(), b"\xFF");
        assert_eq!(entries[1].value.as_bytes(), b"a,b");
        for bad in ["t=%F", "t=%GG", "t=100%", "%FF=v"] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad}");
        }
        assert_eq!(encode(b"\xFF"), "%FF");
    }

    #[test]
    fn a_fully_encoded_query_value_is_still_read() {
        let entries = parse_query_value("tenant%3Dacme%2Croute%3Da%252Cb").unwrap();
        assert_eq!(
            entries,
            [Entry::new("tenant", "acme"), Entry::new("route", "a,b")]
        );
        let entries = parse_query_value("tenant=%FF").unwrap();
        assert_eq!(entries[0].value.as_bytes(), b"\xFF");
    }
}
