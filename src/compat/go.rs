//! Go's value syntax, which envoyproxy/ratelimit's settings are written in.

/// Go's `time.ParseDuration` for non-negative values: `300ms`, `10s`, `1m30s`, `1.5h`.
pub(super) fn go_duration(text: &str) -> Option<std::time::Duration> {
    if text == "0" {
        return Some(std::time::Duration::ZERO);
    }
    let mut rest = text;
    let mut seconds = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3_600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        seconds += number * scale;
    }
    std::time::Duration::try_from_secs_f64(seconds).ok()
}

/// Go's `strconv.ParseBool`, which envoyproxy/ratelimit's settings use.
pub(super) fn go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}
