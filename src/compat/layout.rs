//! Where things are: the config directory of envoyproxy/ratelimit's runtime layout and the
//! listener addresses.

use std::path::PathBuf;

use super::Tr;

/// envoyproxy/ratelimit's defaults where sluice needs them.
const DEFAULT_RUNTIME_ROOT: &str = "/srv/runtime_data/current";
const DEFAULT_RUNTIME_APPDIRECTORY: &str = "config";
const DEFAULT_HOST: &str = "0.0.0.0";
const DEFAULT_GRPC_PORT: &str = "8081";
const DEFAULT_PORT: &str = "8080";
const DEFAULT_DEBUG_PORT: &str = "6070";

impl Tr<'_> {
    /// The config directory; returns whether envoyproxy/ratelimit's layout is in use.
    pub(super) fn runtime_layout(&mut self) -> bool {
        let used = [
            "RUNTIME_ROOT",
            "RUNTIME_SUBDIRECTORY",
            "RUNTIME_APPDIRECTORY",
        ]
        .iter()
        .any(|n| self.env.contains_key(*n));
        if !used {
            return false;
        }
        let mut dir = PathBuf::from(self.get("RUNTIME_ROOT").unwrap_or(DEFAULT_RUNTIME_ROOT));
        match self.get("RUNTIME_SUBDIRECTORY").filter(|s| !s.is_empty()) {
            Some(sub) => dir.push(sub),
            None => self.out.notes.push(
                "RUNTIME_SUBDIRECTORY is empty: envoyproxy/ratelimit would load no config; sluice reads RUNTIME_ROOT/RUNTIME_APPDIRECTORY".to_owned(),
            ),
        }
        dir.push(
            self.get("RUNTIME_APPDIRECTORY")
                .unwrap_or(DEFAULT_RUNTIME_APPDIRECTORY),
        );
        self.set(
            "SLUICE_CONFIG",
            dir.to_string_lossy().into_owned(),
            "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY",
        );
        // envoyproxy/ratelimit reads hidden files unless told not to; sluice never reads the
        // kubelet's `..*` entries either way.
        let ignore_dotfiles = self.bool("RUNTIME_IGNOREDOTFILES").unwrap_or(false);
        self.set(
            "SLUICE_CONFIG_DOTFILES",
            (!ignore_dotfiles).to_string(),
            "RUNTIME_IGNOREDOTFILES",
        );
        if self.env.contains_key("RUNTIME_WATCH_ROOT") {
            self.out.notes.push(
                "RUNTIME_WATCH_ROOT accepted without effect: sluice watches the config directory and every symlink on its path, which covers both modes".to_owned(),
            );
        }
        true
    }

    pub(super) fn listeners(&mut self, layout: bool) {
        if self.env.contains_key("GRPC_HOST") || self.env.contains_key("GRPC_PORT") {
            let addr = self.addr("GRPC_HOST", "GRPC_PORT", DEFAULT_GRPC_PORT);
            if let Some(addr) = addr {
                self.set("SLUICE_GRPC_ADDR", addr, "GRPC_HOST/GRPC_PORT");
            }
        }
        // envoyproxy/ratelimit's PORT serves /healthcheck (what its probes hit) and DEBUG_PORT
        // its debug pages; sluice has one admin listener, serving both kinds, so it goes where
        // the probes go. In an envoyproxy/ratelimit deployment that is PORT even when unset
        // (default 8080). Elsewhere HOST alone is too common a variable (shells set it) to mean
        // anything without PORT.
        let http = layout || self.env.contains_key("PORT");
        let debug = self.env.contains_key("DEBUG_PORT");
        if http {
            if let Some(addr) = self.addr("HOST", "PORT", DEFAULT_PORT) {
                self.set("SLUICE_ADMIN_ADDR", addr, "HOST/PORT");
            }
            if debug {
                self.ignore("DEBUG_PORT", "sluice has one admin listener, on HOST:PORT; it serves /healthcheck and the debug pages' equivalents (/config, /metrics)");
            }
        } else if debug
            && let Some(addr) = self.addr("DEBUG_HOST", "DEBUG_PORT", DEFAULT_DEBUG_PORT)
        {
            self.set("SLUICE_ADMIN_ADDR", addr, "DEBUG_HOST/DEBUG_PORT");
        }
    }

    /// envoyproxy/ratelimit's `PROMETHEUS_ADDR` (Go's `host:port`, `:19001` for every
    /// interface, which Envoy Gateway sets and scrapes): `--metrics-addr`.
    pub(super) fn prometheus(&mut self) {
        let Some(value) = self.get("PROMETHEUS_ADDR").map(str::to_owned) else {
            return;
        };
        let addr = match value.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => value.replacen("localhost:", "127.0.0.1:", 1),
        };
        if addr.parse::<std::net::SocketAddr>().is_ok() {
            self.set("SLUICE_METRICS_ADDR", addr, "PROMETHEUS_ADDR");
        } else {
            self.out.errors.push(format!(
                "PROMETHEUS_ADDR: `{value}` is not host:port or :port with an IP address"
            ));
        }
    }

    fn addr(&mut self, host: &str, port: &str, default_port: &str) -> Option<String> {
        let host_value = match self.get(host).unwrap_or(DEFAULT_HOST) {
            "localhost" => "127.0.0.1".to_owned(),
            other => other.to_owned(),
        };
        let port_value = self.get(port).unwrap_or(default_port).to_owned();
        if port_value.parse::<u16>().is_err() {
            self.out
                .errors
                .push(format!("{port}: `{port_value}` is not a port number"));
            return None;
        }
        let addr = if host_value.contains(':') {
            format!("[{host_value}]:{port_value}")
        } else {
            format!("{host_value}:{port_value}")
        };
        if addr.parse::<std::net::SocketAddr>().is_err() {
            self.out.errors.push(format!(
                "{host}: `{host_value}` is not an IP address (sluice binds addresses, not host names)"
            ));
            return None;
        }
        Some(addr)
    }
}
