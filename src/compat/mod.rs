//! Drop-in compatibility with envoyproxy/ratelimit deployments: its environment settings become
//! sluice's own, so switching is a change of image.
//!
//! [`apply`] is pure: environment in, [`Translation`] out. `main` turns the translation into
//! `serve` flags ([`Translation::args`]) before the command line is parsed, so precedence is
//! command line > `SLUICE_*` variable > envoyproxy/ratelimit variable > default, and logs what it
//! did once logging is up ([`Translation::log`]). Every envoyproxy/ratelimit setting sluice does
//! not support is reported as `ignored: NAME`, never dropped silently.
//!
//! The config directory is envoyproxy/ratelimit's
//! `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY` (goruntime loads
//! `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY` and keeps the keys under `RUNTIME_APPDIRECTORY`).
//!
//! One file per concern: [`layout`] (config directory and listener addresses), [`redis`] (the
//! Redis backend and its URLs), [`flags`] (logging, limits, metrics, tracing, headers, xDS),
//! [`unsupported`] (what sluice has no equivalent for), [`go`] (Go's value syntax) and
//! [`router`] (envoyproxy/ratelimit's `/healthcheck`).

mod flags;
mod go;
mod layout;
mod redis;
mod router;
mod unsupported;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;

pub use router::router;

use go::go_bool;
use redis::{URL_SETTINGS, redact_userinfo};

/// What an envoyproxy/ratelimit environment means for sluice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// `SLUICE_*` variable → value, for settings whose own `SLUICE_*` variable is unset.
    pub overrides: BTreeMap<String, String>,
    /// `SLUICE_*` variable → the envoyproxy/ratelimit setting(s) it came from.
    pub origins: BTreeMap<String, String>,
    /// envoyproxy/ratelimit settings sluice does not support, in name order.
    pub ignored: Vec<Ignored>,
    /// Settings accepted without effect, and envoyproxy/ratelimit defaults adopted, for the log.
    pub notes: Vec<String>,
    /// Values that cannot be translated; `serve` refuses to start, as envoyproxy/ratelimit would.
    pub errors: Vec<String>,
}

/// One unsupported setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    pub name: String,
    pub reason: &'static str,
}

/// Translates an envoyproxy/ratelimit environment. `env` is the whole process environment.
pub fn apply(env: &HashMap<String, String>) -> Translation {
    let mut t = Tr {
        env,
        out: Translation::default(),
    };
    let layout = t.runtime_layout();
    t.listeners(layout);
    t.prometheus();
    t.redis();
    t.logging();
    t.limits(layout);
    t.unsupported();
    t.out.ignored.sort_by(|a, b| a.name.cmp(&b.name));
    t.out.ignored.dedup_by(|a, b| a.name == b.name);
    t.out
}

struct Tr<'e> {
    env: &'e HashMap<String, String>,
    out: Translation,
}

impl Tr<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str)
    }

    /// Sets `SLUICE_<name>` unless the environment sets it itself (sluice's own wins).
    fn set(&mut self, sluice: &str, value: impl Into<String>, from: &str) {
        if self.env.contains_key(sluice) {
            self.out
                .notes
                .push(format!("{from} not applied: {sluice} is set and wins"));
            return;
        }
        self.out.overrides.insert(sluice.to_owned(), value.into());
        self.out.origins.insert(sluice.to_owned(), from.to_owned());
    }

    fn ignore(&mut self, name: &str, reason: &'static str) {
        self.out.ignored.push(Ignored {
            name: name.to_owned(),
            reason,
        });
    }

    fn bool(&mut self, name: &str) -> Option<bool> {
        let value = self.get(name)?;
        match go_bool(value) {
            Some(b) => Some(b),
            None => {
                self.out
                    .errors
                    .push(format!("{name}: `{value}` is not a boolean"));
                None
            }
        }
    }
}

/// The process's command line, with the environment's envoyproxy/ratelimit settings added as
/// flags when the subcommand is `serve`, and the translation (to log once logging is set up).
/// Other subcommands get their command line unchanged. `Err` holds every untranslatable value.
pub fn serve_args() -> Result<(Vec<OsString>, Translation), Vec<String>> {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_none_or(|a| a != "serve") {
        return Ok((args, Translation::default()));
    }
    // Names and values that are not UTF-8 are no envoyproxy/ratelimit settings.
    let env: HashMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let translation = apply(&env);
    if !translation.errors.is_empty() {
        return Err(translation.errors);
    }
    let cli = <crate::settings::Cli as clap::CommandFactory>::command();
    let serve = cli.find_subcommand("serve");
    let flag_of = |variable: &str| {
        serve?
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == variable))
            .and_then(|a| a.get_long())
            .map(|long| format!("--{long}"))
    };
    let mut translation = translation;
    // A setting another part of sluice owns may be missing from this build: say so.
    let missing: Vec<String> = translation
        .overrides
        .keys()
        .filter(|v| flag_of(v).is_none())
        .cloned()
        .collect();
    for variable in missing {
        translation.overrides.remove(&variable);
        let name = translation.origins.remove(&variable).unwrap_or(variable);
        translation.ignored.push(Ignored {
            name,
            reason: "this sluice build has no setting for it",
        });
    }
    let args = translation.args(args, flag_of);
    Ok((args, translation))
}

impl Translation {
    /// The `serve` command line with each override appended as a flag, unless the command line
    /// already gives that flag. `flag_of` maps a `SLUICE_*` variable to its `--flag`.
    pub fn args(
        &self,
        args: Vec<OsString>,
        flag_of: impl Fn(&str) -> Option<String>,
    ) -> Vec<OsString> {
        let mut out = args;
        for (variable, value) in &self.overrides {
            let Some(flag) = flag_of(variable) else {
                continue;
            };
            let given = out.iter().any(|a| {
                let a = a.to_string_lossy();
                a == flag || a.starts_with(&format!("{flag}="))
            });
            if !given {
                out.push(format!("{flag}={value}").into());
            }
        }
        out
    }

    /// Logs, once, what was translated and what is ignored.
    pub fn log(&self) {
        for (variable, value) in &self.overrides {
            let shown = if URL_SETTINGS.contains(&variable.as_str()) {
                redact_userinfo(value)
            } else {
                value.clone()
            };
            let from = self.origins.get(variable).map_or("", String::as_str);
            tracing::info!("envoyproxy/ratelimit setting applied: {from} → {variable}={shown}");
        }
        for note in &self.notes {
            tracing::info!("{note}");
        }
        // Never silent: a log level above warn must not hide what is ignored.
        let logged = tracing::enabled!(tracing::Level::WARN);
        for ignored in &self.ignored {
            if logged {
                tracing::warn!("ignored: {} ({})", ignored.name, ignored.reason);
            } else {
                eprintln!("sluice: ignored: {} ({})", ignored.name, ignored.reason);
            }
        }
    }
}
