//! `sluice top`: the admin listener's `GET /top` as a terminal view that refreshes in place.

use std::fmt::Write as _;
use std::process::ExitCode;

use serde::Deserialize;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

use super::admin::exchange;
use crate::settings::TopArgs;

#[derive(Deserialize)]
struct View {
    window_seconds: u64,
    capacity: usize,
    rules: Vec<RuleView>,
    /// Rules in the whole view (the answer holds the first page).
    #[serde(default)]
    rules_total: usize,
    untracked: u64,
    skipped: u64,
}

#[derive(Deserialize)]
struct RuleView {
    rule: String,
    limited: Vec<Ranked>,
    limited_total: u64,
    active: Vec<Ranked>,
    active_total: u64,
}

#[derive(Deserialize)]
struct Ranked {
    key: String,
    count: u64,
    error: u64,
}

pub fn run(args: &TopArgs) -> ExitCode {
    let mut path = format!("/top?n={}", args.keys);
    if let Some(rule) = &args.rule {
        let _ = write!(
            path,
            "&rule={}",
            utf8_percent_encode(rule, NON_ALPHANUMERIC)
        );
    }
    let token = match super::admin::token(args.admin_token_file.as_deref()) {
        Ok(token) => token,
        Err(e) => {
            eprintln!("sluice top: --admin-token-file {e}");
            return ExitCode::FAILURE;
        }
    };
    loop {
        let answer = exchange(&args.admin, "GET", &path, token.as_deref());
        let shown: Result<String, String> = match answer {
            Ok((200, body)) => serde_json::from_str::<View>(&body)
                .map(|view| render(&view, &args.admin))
                .map_err(|e| format!("unreadable answer from {}: {e}", args.admin)),
            Ok((status, body)) => Err(format!("{} answered {status}: {body}", args.admin)),
            Err(e) => Err(format!("{}: {e}", args.admin)),
        };
        let ok = shown.is_ok();
        let shown = shown.unwrap_or_else(|e| format!("sluice top: {e}\n"));
        if args.once {
            print!("{shown}");
            return if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
        // Home and clear, then the view: it refreshes in place.
        print!("\x1b[H\x1b[2J{shown}");
        std::thread::sleep(args.interval);
    }
}

/// One table per rule: the keys most limited beside the most active, with their error bounds.
fn render(view: &View, admin: &str) -> String {
    let mut out = format!(
        "sluice top — {admin} — last {}–{} s, {} counters per summary (counts ± error)\n",
        view.window_seconds,
        2 * view.window_seconds,
        view.capacity
    );
    if view.rules.is_empty() {
        out.push_str("\nno limited rule decided anything in that span\n");
    }
    for rule in &view.rules {
        let _ = writeln!(
            out,
            "\n{}  — {} over limit of {} decisions",
            rule.rule, rule.limited_total, rule.active_total
        );
        let _ = writeln!(out, "  {:<44} {:<44}", "most limited", "most active");
        let rows = rule.limited.len().max(rule.active.len());
        for i in 0..rows {
            let cell = |list: &[Ranked]| list.get(i).map(cell).unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:<44} {:<44}",
                cell(&rule.limited),
                cell(&rule.active)
            );
        }
    }
    if view.rules_total > view.rules.len() {
        let _ = writeln!(
            out,
            "\n{} more rules with decisions; --rule PATH shows one",
            view.rules_total - view.rules.len()
        );
    }
    if view.untracked > 0 || view.skipped > 0 {
        let _ = writeln!(
            out,
            "\n{} decisions of rules past the tracked bound, {} skipped while the summaries were busy",
            view.untracked, view.skipped
        );
    }
    out
}

fn cell(r: &Ranked) -> String {
    let mut key: String = r.key.chars().take(28).collect();
    if key.len() < r.key.len() {
        key.push('…');
    }
    if r.error == 0 {
        format!("{key}  {}", r.count)
    } else {
        format!("{key}  {} ±{}", r.count, r.error)
    }
}
