//! Config parser and validator: any text, split into up to three files, either loads or yields
//! located diagnostics; never panics, never hangs, and loading is deterministic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::config::load_sources;
use sluice::request::Entry;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let sources: Vec<(String, String)> = text
        .splitn(3, '\0')
        .enumerate()
        .map(|(i, part)| (format!("f{i}.yaml"), part.to_string()))
        .collect();
    let first = load_sources(&sources);
    let again = load_sources(&sources);
    match (&first, &again) {
        (Ok(config), Ok(other)) => {
            assert_eq!(config.digest(), other.digest());
            assert_eq!(config.summary(), other.summary());
            let json = config.to_json();
            assert_eq!(
                json["rule_count"].as_u64(),
                Some(config.rule_count() as u64)
            );
            for (i, rule) in config.rules().enumerate() {
                assert_eq!(rule.id.0 as usize, i);
                assert!(rule.cost >= 1);
                assert!(config.domain(&rule.domain).is_some());
            }
            // Matching arbitrary entries drawn from the text itself never panics and only ever
            // reaches a rule of that domain.
            for domain in config.domains() {
                let words: Vec<&str> = text.split_whitespace().take(8).collect();
                for window in words.windows(2).take(4) {
                    let entries = [Entry::new(window[0], window[1])];
                    if let Some(rule) = domain.find(&entries) {
                        assert_eq!(&*rule.domain, &*domain.name);
                    }
                }
            }
        }
        (Err(errors), Err(other)) => {
            assert_eq!(errors, other);
            assert!(!errors.0.is_empty(), "a rejected config says why");
            for d in &errors.0 {
                assert!(sources.iter().any(|(name, _)| *name == d.file), "{d}");
                assert!(!d.message.chars().any(char::is_control), "{d}");
                let _ = d.to_string();
            }
        }
        _ => panic!("the same sources loaded differently"),
    }
});
