//! The subcommands: `serve` runs the server on its runtime until SIGTERM/SIGINT; `check-config`
//! and `explain` print for humans and CI; `bucket` ([`bucket`]) asks a running server's admin
//! listener. Each returns the process's exit code.

mod admin;
pub mod bucket;
pub mod top;

use std::process::ExitCode;

use crate::algorithm::Algorithm;
use crate::config::args::load_options;
use crate::config::{Config, ConfigErrors, load_path_with};
use crate::explain::{
    ExplainOptions, explain as explain_descriptor, explain_bucket, parse_descriptor,
};
use crate::rule::Limit;
use crate::settings::{CheckConfigArgs, ExplainArgs, OtlpSettings, OutputFormat, Settings};
use crate::{compat, runtime, server, telemetry};

/// `sluice serve`: the main thread's runtime, the first serving thread (the server starts the
/// others: [`runtime`]), logs and traces, then the server until a shutdown signal.
pub fn serve(settings: Settings, compat: compat::Translation) -> ExitCode {
    match runtime::current_thread() {
        Ok(runtime) => runtime.block_on(serve_on_runtime(settings, compat)),
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve_on_runtime(mut settings: Settings, compat: compat::Translation) -> ExitCode {
    settings.telemetry.otlp = OtlpSettings::from_process_env();
    let telemetry = telemetry::init(
        &settings.log_level,
        settings.log_format,
        &settings.telemetry,
    );
    compat.log();
    if settings.max_value_bytes.is_some() {
        tracing::warn!(
            "--max-value-bytes (SLUICE_MAX_VALUE_BYTES) is deprecated and has no effect: every \
             descriptor value is decided whatever its length; --max-message-bytes bounds requests"
        );
    }
    let result = server::run(settings, server::shutdown_signal()).await;
    telemetry.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("sluice: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Text: a one-line summary on stdout and each warning on stderr, exit 0; or every error as
/// `file:line:col: message` on stderr, exit 1. JSON: one document on stdout either way. Warnings
/// never change the exit code.
pub fn check_config(args: &CheckConfigArgs) -> ExitCode {
    let result = load_path_with(&args.path, &load_options(&args.load, args.max_entries));
    match args.format {
        OutputFormat::Json => {
            println!("{}", check_json(&result));
        }
        OutputFormat::Text => match &result {
            Ok(config) => {
                println!("{}", check_summary(config));
                for warning in config.warnings() {
                    eprintln!("warning: {warning}");
                }
            }
            Err(errors) => eprintln!("{errors}"),
        },
    }
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `ok: 2 domains (api, edge), 9 rules, digest 1a2b3c4d[, 3 warnings]`; when any rule counts
/// with another algorithm than the token bucket, the rules are broken down by algorithm:
/// `9 rules (7 token_bucket, 2 fixed_window)`.
fn check_summary(config: &Config) -> String {
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let names: Vec<&str> = config.domains().map(|d| &*d.name).collect();
    let counts = algorithm_counts(config);
    let by_algorithm = if counts.iter().all(|(a, _)| *a == Algorithm::TokenBucket) {
        String::new()
    } else {
        let parts: Vec<String> = counts.iter().map(|(a, n)| format!("{n} {a}")).collect();
        format!(" ({})", parts.join(", "))
    };
    let mut line = format!(
        "ok: {} ({}), {}{by_algorithm}, digest {}",
        plural(names.len(), "domain"),
        names.join(", "),
        plural(config.rule_count(), "rule"),
        &config.digest()[..8]
    );
    let leased = config.rules().filter(|r| r.lease.is_some()).count();
    if leased > 0 {
        line.push_str(&format!(", {leased} leased"));
    }
    let sharded = config.rules().filter(|r| r.shards.is_some()).count();
    if sharded > 0 {
        line.push_str(&format!(", {sharded} sharded"));
    }
    if !config.warnings().is_empty() {
        line.push_str(&format!(", {}", plural(config.warnings().len(), "warning")));
    }
    line
}

/// Rules that keep state (not `unlimited`) per algorithm, in [`Algorithm::ALL`] order, leaving
/// out algorithms no rule uses.
fn algorithm_counts(config: &Config) -> Vec<(Algorithm, usize)> {
    Algorithm::ALL
        .into_iter()
        .map(|a| {
            let n = config
                .rules()
                .filter(|r| matches!(r.limit, Limit::Bucket(_)) && r.algorithm == a)
                .count();
            (a, n)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn check_json(result: &Result<Config, ConfigErrors>) -> serde_json::Value {
    match result {
        Ok(config) => serde_json::json!({
            "ok": true,
            "errors": [],
            "warnings": config.warnings(),
            "domains": config
                .domains()
                .map(|d| serde_json::json!({
                    "name": d.name,
                    "file": d.file(),
                    "rules": d.rules().len(),
                    "algorithm": d.algorithm,
                }))
                .collect::<Vec<_>>(),
            "rules": config.rule_count(),
            "algorithms": algorithm_counts(config)
                .into_iter()
                .map(|(a, n)| (a.as_str().to_owned(), serde_json::json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "digest": config.digest(),
        }),
        Err(errors) => serde_json::json!({
            "ok": false,
            "errors": errors.0,
            "warnings": [],
            "domains": [],
            "rules": 0,
            "algorithms": {},
            "digest": null,
        }),
    }
}

/// Prints how the config treats one descriptor. Exit 0 once explained (matched or not), 1 when
/// the config does not load, 2 when the descriptor argument cannot be read.
pub fn explain(args: &ExplainArgs) -> ExitCode {
    let (flag, text) = match (&args.descriptor, &args.bucket) {
        (_, Some(bucket)) => ("--bucket", bucket),
        (Some(descriptor), None) => ("--descriptor", descriptor),
        (None, None) => unreachable!("clap requires --descriptor or --bucket"),
    };
    let entries = match parse_descriptor(text) {
        Ok(entries) => entries,
        Err(e) => {
            eprintln!("sluice explain: {flag}: {e}");
            return ExitCode::from(2);
        }
    };
    let config = match load_path_with(&args.config, &load_options(&args.load, args.max_entries)) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::FAILURE;
        }
    };
    let options = ExplainOptions {
        key_prefix: args.key_prefix.clone(),
        default_failure_mode: args.failure_mode.into(),
    };
    let (text, json) = if args.bucket.is_some() {
        match explain_bucket(&config, &args.domain, &entries, &options) {
            Ok(report) => (report.to_text(), serde_json::to_string_pretty(&report)),
            Err(e) => {
                eprintln!("sluice explain: --bucket: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        let report = explain_descriptor(&config, &args.domain, &entries, &options);
        (report.to_text(), serde_json::to_string_pretty(&report))
    };
    match args.format {
        OutputFormat::Text => print!("{text}"),
        OutputFormat::Json => println!("{}", json.unwrap_or_default()),
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_sources;

    #[test]
    fn the_summary_names_the_domains_and_counts_warnings() {
        let a = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        let b = "domain: b\ndescriptors:\n  - key: dead\n";
        let config =
            load_sources(&[("a.yaml".into(), a.into()), ("b.yaml".into(), b.into())]).unwrap();
        assert_eq!(
            check_summary(&config),
            format!(
                "ok: 2 domains (a, b), 1 rule, digest {}, 1 warning",
                &config.digest()[..8]
            )
        );
        let json = check_json(&Ok(config));
        assert_eq!(json["ok"], true);
        assert_eq!(json["rules"], 1);
        assert_eq!(json["domains"][1]["name"], "b");
        assert_eq!(json["warnings"][0]["line"], 3);
        assert_eq!(json["algorithms"], serde_json::json!({"token_bucket": 1}));
        assert_eq!(json["domains"][0]["algorithm"], "token_bucket");
    }

    #[test]
    fn the_summary_breaks_rules_down_by_algorithm_once_another_is_used() {
        let a = "domain: a
algorithm: fixed_window
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: j
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket}
  - key: h
    rate_limit: {unlimited: true}
";
        let config = load_sources(&[("a.yaml".into(), a.into())]).unwrap();
        assert_eq!(
            check_summary(&config),
            format!(
                "ok: 1 domain (a), 3 rules (1 token_bucket, 1 fixed_window), digest {}",
                &config.digest()[..8]
            )
        );
        let json = check_json(&Ok(config));
        assert_eq!(
            json["algorithms"],
            serde_json::json!({"token_bucket": 1, "fixed_window": 1})
        );
        assert_eq!(json["domains"][0]["algorithm"], "fixed_window");
    }

    #[test]
    fn the_summary_counts_leased_and_sharded_rules() {
        let a = "domain: a
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 100, shards: 4, lease: 5}
  - key: j
    rate_limit: {unit: second, requests_per_unit: 8, shards: 2}
";
        let config = load_sources(&[("a.yaml".into(), a.into())]).unwrap();
        assert_eq!(
            check_summary(&config),
            format!(
                "ok: 1 domain (a), 2 rules, digest {}, 1 leased, 2 sharded",
                &config.digest()[..8]
            )
        );
    }

    #[test]
    fn json_errors_carry_file_line_and_column() {
        let result = load_sources(&[("x.yaml".into(), "domain: x\nbogus: 1\n".into())]);
        let json = check_json(&result);
        assert_eq!(json["ok"], false);
        assert_eq!(json["errors"][0]["file"], "x.yaml");
        assert_eq!(json["errors"][0]["line"], 2);
        assert_eq!(json["errors"][0]["column"], 1);
        assert!(json["digest"].is_null());
    }
}
