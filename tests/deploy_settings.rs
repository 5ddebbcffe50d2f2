//! The settings the deployment files give sluice are real settings: every `SLUICE_*` variable of
//! the Kubernetes Deployment names a flag of `sluice serve` and its value parses, and the image's
//! entrypoint is a valid command line. clap ignores unknown environment variables, so a
//! misspelled name (`SLUICE_REDIS_URLS`) would otherwise be dropped silently in production.

use clap::Parser;
use serde_json::Value;
use sluice::settings::{Cli, Command};

fn manifest_dir() -> &'static str {
    env!("CARGO_MANIFEST_DIR")
}

/// `SLUICE_REDIS_URL` → `--redis-url`, as clap derives the env name from the flag.
fn flag_of(variable: &str) -> Option<String> {
    let name = variable.strip_prefix("SLUICE_")?;
    Some(format!("--{}", name.to_ascii_lowercase().replace('_', "-")))
}

/// Every (name, value) of the container environment in the Deployment.
fn deployment_env() -> Vec<(String, String)> {
    let path = format!("{}/deploy/kubernetes/deployment.yaml", manifest_dir());
    let text = std::fs::read_to_string(&path).expect("deployment.yaml");
    let doc: Value = serde_saphyr::from_str(&text).expect("deployment.yaml is YAML");
    let containers = doc["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    let mut out = Vec::new();
    for container in containers {
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().expect("env name").to_string();
            // Values from a Secret or ConfigMap are not in the file; their names still count.
            let value = var["value"].as_str().map(str::to_string);
            out.push((name, value.unwrap_or_default()));
        }
    }
    out
}

#[test]
fn every_sluice_variable_of_the_deployment_is_a_serve_flag_with_a_valid_value() {
    let env = deployment_env();
    let sluice: Vec<&(String, String)> = env
        .iter()
        .filter(|(name, _)| name.starts_with("SLUICE_"))
        .collect();
    assert!(
        sluice.len() >= 4,
        "expected the Deployment to configure sluice: {env:?}"
    );
    let mut args: Vec<String> = ["sluice", "serve", "--config", "/etc/sluice/config"]
        .map(String::from)
        .to_vec();
    for (name, value) in &sluice {
        let flag = flag_of(name).expect("SLUICE_ prefix");
        // One flag at a time first, so a failure names the variable.
        let alone = Cli::try_parse_from([
            "sluice",
            "serve",
            "--config",
            "c",
            flag.as_str(),
            value.as_str(),
        ]);
        assert!(
            alone.is_ok(),
            "deployment.yaml: {name}={value:?} is not a valid `sluice serve {flag}`: {}",
            alone.err().map(|e| e.to_string()).unwrap_or_default()
        );
        args.push(flag);
        args.push(value.clone());
    }
    let cli = Cli::try_parse_from(&args).expect("all together");
    assert!(matches!(cli.command, Command::Serve(_)));
}

#[test]
fn a_misspelled_variable_would_be_caught() {
    let flag = flag_of("SLUICE_REDIS_URLS").unwrap();
    assert!(Cli::try_parse_from(["sluice", "serve", "--config", "c", &flag, "redis://x"]).is_err());
}

#[test]
fn the_image_entrypoint_is_a_valid_command_line() {
    let path = format!("{}/deploy/Dockerfile", manifest_dir());
    let text = std::fs::read_to_string(path).expect("Dockerfile");
    let line = text
        .lines()
        .find(|l| l.starts_with("ENTRYPOINT"))
        .expect("an ENTRYPOINT");
    let json = line.trim_start_matches("ENTRYPOINT").trim();
    let argv: Vec<String> = serde_json::from_str(json).expect("exec-form ENTRYPOINT");
    assert!(argv[0].ends_with("/sluice"), "{argv:?}");
    let cli = Cli::try_parse_from(&argv).expect("entrypoint parses");
    match cli.command {
        Command::Serve(settings) => {
            assert_eq!(
                settings.config.as_deref(),
                Some(std::path::Path::new("/etc/sluice/config"))
            );
        }
        other => panic!("the entrypoint runs {other:?}, not serve"),
    }
}
