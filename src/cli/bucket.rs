//! `sluice bucket show|reset`: a client of a running sluice's `GET|DELETE /buckets` (see
//! `src/admin/buckets.rs`). Prints the answer's JSON; exit 0 on 200, 1 on any other answer (its
//! error on stderr), 2 when the admin listener cannot be reached.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use crate::settings::{BucketAction, BucketArgs, BucketTarget};

/// Bound on connecting to and hearing from the admin listener.
const TIMEOUT: Duration = Duration::from_secs(10);

pub fn run(args: &BucketArgs) -> ExitCode {
    let (method, target) = match &args.action {
        BucketAction::Show(target) => ("GET", target),
        BucketAction::Reset(target) => ("DELETE", target),
    };
    let path = path(target);
    match exchange(&target.admin, method, &path) {
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

/// `/buckets?domain=D&descriptor=k=v,...` (or `bucket=`), every value percent-encoded.
fn path(target: &BucketTarget) -> String {
    let name = if target.bucket {
        "bucket"
    } else {
        "descriptor"
    };
    let encode = |text: &str| utf8_percent_encode(text, NON_ALPHANUMERIC).to_string();
    format!(
        "/buckets?domain={}&{name}={}",
        encode(&target.domain),
        encode(&target.entries.join(","))
    )
}

fn pretty(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| body.to_owned())
}

/// One HTTP/1.0 request (the server closes the connection after answering): status and body.
fn exchange(admin: &str, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let addr = admin.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no address for the admin listener",
        )
    })?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {admin}\r\nAccept: application/json\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP status"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_encodes_every_value() {
        let target = BucketTarget {
            admin: "127.0.0.1:6070".into(),
            domain: "edge".into(),
            bucket: false,
            entries: vec!["tenant=acme".into(), "route=a%2Cb".into()],
        };
        assert_eq!(
            path(&target),
            "/buckets?domain=edge&descriptor=tenant%3Dacme%2Croute%3Da%252Cb"
        );
        let bucket = BucketTarget {
            bucket: true,
            ..target
        };
        assert!(path(&bucket).contains("&bucket=tenant%3Dacme"));
    }
}
