//! `sluice bucket show|reset`: a client of a running sluice's `GET|DELETE /buckets` (see
//! `src/admin/buckets.rs`). Prints the answer's JSON; exit 0 on 200, 1 on any other answer (its
//! error on stderr), 2 when the admin listener cannot be reached.

use std::process::ExitCode;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use super::admin::exchange;
use crate::settings::{BucketAction, BucketArgs, BucketTarget};

pub fn run(args: &BucketArgs) -> ExitCode {
    let (method, target) = match &args.action {
        BucketAction::Show(target) => ("GET", target),
        BucketAction::Reset(target) => ("DELETE", target),
    };
    let path = match path(target) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("sluice bucket: {e}");
            return ExitCode::FAILURE;
        }
    };
    let token = match super::admin::token(target.admin_token_file.as_deref()) {
        Ok(token) => token,
        Err(e) => {
            eprintln!("sluice bucket: --admin-token-file {e}");
            return ExitCode::FAILURE;
        }
    };
    match exchange(&target.admin, method, &path, token.as_deref()) {
        Ok((200, body)) => {
            println!("{}", pretty(&body));
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            let message = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned))
                .unwrap_or_else(|| body.clone());
            eprintln!("sluice bucket: {method} {path}: {status}: {message}");
            if status == 503 {
                println!("{}", pretty(&body));
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sluice bucket: {}: {e}", target.admin);
            ExitCode::from(2)
        }
    }
}

/// `/buckets?domain=D&descriptor=k=v,...` (or `bucket=`): the entries read as
/// [`crate::value_text`]'s form and written back in it, so the query names exactly their bytes.
fn path(target: &BucketTarget) -> Result<String, crate::value_text::TextError> {
    let name = if target.bucket {
        "bucket"
    } else {
        "descriptor"
    };
    let entries = crate::value_text::parse(target.entries.join(",").as_bytes())?;
    Ok(format!(
        "/buckets?domain={}&{name}={}",
        utf8_percent_encode(&target.domain, NON_ALPHANUMERIC),
        crate::value_text::entries_text(&entries)
    ))
}

fn pretty(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_names_the_entries_bytes_in_the_one_form() {
        let target = BucketTarget {
            admin: "127.0.0.1:6070".into(),
            domain: "edge".into(),
            bucket: false,
            entries: vec!["tenant=acme".into(), "route=a%2Cb".into(), "raw=%ff".into()],
            admin_token_file: None,
        };
        assert_eq!(
            path(&target).unwrap(),
            "/buckets?domain=edge&descriptor=tenant=acme,route=a%2Cb,raw=%FF"
        );
        let bucket = BucketTarget {
            bucket: true,
            ..target.clone()
        };
        assert!(path(&bucket).unwrap().contains("&bucket=tenant=acme"));
        let bad = BucketTarget {
            entries: vec!["tenant=100%".into()],
            ..target
        };
        assert!(path(&bad).is_err(), "a lone % is an error, not a guess");
    }
}
