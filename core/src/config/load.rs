//! Reading config sources from the filesystem.

use std::fs;
use std::path::Path;

use super::{Config, ConfigErrors, Diagnostic, LoadOptions, load_sources_with};

/// Loads a YAML file or a directory of `*.yaml`/`*.yml` files (one domain per file).
///
/// A directory is read one level deep, in name order. Symlinks are followed, and hidden entries
/// are skipped: a Kubernetes ConfigMap volume holds `..data` and `..2024_…` directories next to
/// symlinks to the real files, and each file must be read once.
pub fn load_path(path: &Path) -> Result<Config, ConfigErrors> {
    load_path_with(path, &LoadOptions::default())
}

/// [`load_path`] with `options` (merged domains, hidden files, global shadow mode).
pub fn load_path_with(path: &Path, options: &LoadOptions) -> Result<Config, ConfigErrors> {
    let sources = read_sources(path, options)?;
    load_sources_with(&sources, options)
}

/// Whether a directory entry named `name` is a config file candidate.
fn wanted(name: &str, options: &LoadOptions) -> bool {
    let hidden = name.starts_with('.');
    // `..data`, `..2024_…`: the kubelet's bookkeeping, never config.
    let kubelet = name.starts_with("..");
    (name.ends_with(".yaml") || name.ends_with(".yml")) && !kubelet && (!hidden || options.dotfiles)
}

fn read_sources(path: &Path, options: &LoadOptions) -> Result<Vec<(String, String)>, ConfigErrors> {
    let shown = path.display().to_string();
    let metadata = fs::metadata(path).map_err(|e| unplaced(&shown, format!("cannot read: {e}")))?;
    if !metadata.is_dir() {
        return read_file(path, shown)
            .map(|source| vec![source])
            .map_err(|d| ConfigErrors(vec![d]));
    }

    let entries =
        fs::read_dir(path).map_err(|e| unplaced(&shown, format!("cannot list directory: {e}")))?;
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                problems.push(diagnostic(&shown, format!("cannot list directory: {e}")));
                continue;
            }
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        if !wanted(&name, options) {
            continue;
        }
        let full = entry.path();
        // `fs::metadata` follows symlinks, unlike `DirEntry::metadata`.
        match fs::metadata(&full) {
            Ok(m) if m.is_file() => files.push((name, full)),
            Ok(_) => {}
            Err(e) => problems.push(diagnostic(
                &full.display().to_string(),
                format!("cannot read: {e}"),
            )),
        }
    }
    if files.is_empty() && problems.is_empty() {
        return Err(unplaced(
            &shown,
            format!("no config files (*.yaml, *.yml) in {shown}"),
        ));
    }
    files.sort();

    let mut sources = Vec::with_capacity(files.len());
    for (_, full) in files {
        match read_file(&full, full.display().to_string()) {
            Ok(source) => sources.push(source),
            Err(d) => problems.push(d),
        }
    }
    if problems.is_empty() {
        Ok(sources)
    } else {
        // Report the readable files' own problems too, not just the unreadable ones.
        match load_sources_with(&sources, options) {
            Ok(_) => {}
            Err(ConfigErrors(more)) => problems.extend(more),
        }
        Err(ConfigErrors(problems))
    }
}

fn read_file(path: &Path, shown: String) -> Result<(String, String), Diagnostic> {
    let bytes = fs::read(path).map_err(|e| diagnostic(&shown, format!("cannot read: {e}")))?;
    match String::from_utf8(bytes) {
        Ok(text) => Ok((shown, text)),
        Err(e) => {
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            // The prefix is valid UTF-8 by definition of `valid_up_to`.
            let valid = std::str::from_utf8(valid).unwrap_or_default();
            let line = valid.matches('\n').count() + 1;
            let column = valid.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            Err(Diagnostic {
                file: shown,
                line,
                column,
                message: "file is not valid UTF-8".to_owned(),
            })
        }
    }
}

fn diagnostic(file: &str, message: String) -> Diagnostic {
    Diagnostic {
        file: file.to_owned(),
        line: 0,
        column: 0,
        message,
    }
}

fn unplaced(file: &str, message: String) -> ConfigErrors {
    ConfigErrors(vec![diagnostic(file, message)])
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::*;
    use crate::config::load_sources;

    const A: &str = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    const B: &str = "domain: b\n";

    fn write(dir: &Path, name: &str, text: &str) {
        fs::write(dir.join(name), text).unwrap();
    }

    fn messages(err: ConfigErrors) -> Vec<String> {
        err.0.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_single_file() {
        let dir = tempfile::tempdir().unwrap();
        // Any name will do when the file is given explicitly.
        write(dir.path(), "limits.conf", A);
        let config = load_path(&dir.path().join("limits.conf")).unwrap();
        assert_eq!(config.rule_count(), 1);
        let rule = config.rules().next().unwrap();
        assert_eq!(
            &*rule.source,
            format!("{}:3", dir.path().join("limits.conf").display())
        );
    }

    #[test]
    fn a_directory_reads_yaml_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "20-b.yml", B);
        write(dir.path(), "10-a.yaml", A);
        write(dir.path(), "README.md", "not yaml: [");
        write(dir.path(), "c.yaml.bak", "not yaml: [");
        write(dir.path(), ".hidden.yaml", "not yaml: [");
        fs::create_dir(dir.path().join("nested.yaml")).unwrap();
        write(&dir.path().join("nested.yaml"), "x.yaml", "not yaml: [");
        let config = load_path(dir.path()).unwrap();
        let names: Vec<&str> = config.domains().map(|d| &*d.name).collect();
        assert_eq!(names, ["a", "b"]);
        let files: Vec<String> = config.domains().map(|d| d.file().to_owned()).collect();
        assert_eq!(
            files,
            [
                dir.path().join("10-a.yaml").display().to_string(),
                dir.path().join("20-b.yml").display().to_string(),
            ]
        );
        // The digest ignores where the directory is.
        let same = load_sources(&[
            ("10-a.yaml".into(), A.into()),
            ("20-b.yml".into(), B.into()),
        ])
        .unwrap();
        assert_eq!(config.digest(), same.digest());
    }

    #[cfg(unix)]
    #[test]
    fn a_kubernetes_configmap_volume_is_read_once() {
        use std::os::unix::fs::symlink;
        // What the kubelet writes: the data in a timestamped directory, `..data` pointing at
        // it, and one top-level symlink per key through `..data`.
        let dir = tempfile::tempdir().unwrap();
        let stamped = dir.path().join("..2024_05_01_12_00_00.123456789");
        fs::create_dir(&stamped).unwrap();
        write(&stamped, "a.yaml", A);
        write(&stamped, "b.yaml", B);
        symlink("..2024_05_01_12_00_00.123456789", dir.path().join("..data")).unwrap();
        symlink("..data/a.yaml", dir.path().join("a.yaml")).unwrap();
        symlink("..data/b.yaml", dir.path().join("b.yaml")).unwrap();
        let config = load_path(dir.path()).unwrap();
        let names: Vec<&str> = config.domains().map(|d| &*d.name).collect();
        assert_eq!(names, ["a", "b"]);
        // The directory itself may be reached through a symlink too.
        let link = tempfile::tempdir().unwrap();
        symlink(dir.path(), link.path().join("conf")).unwrap();
        assert_eq!(
            load_path(&link.path().join("conf")).unwrap().rule_count(),
            1
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_dangling_symlink_is_reported_with_the_other_problems() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        symlink("missing.yaml", dir.path().join("a.yaml")).unwrap();
        write(dir.path(), "b.yaml", "domain: b\nbogus: 1\n");
        let found = messages(load_path(dir.path()).unwrap_err());
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with(&format!(
            "{}: cannot read: ",
            dir.path().join("a.yaml").display()
        )));
        assert!(found[1].starts_with(&format!(
            "{}:2:1: unknown field `bogus`",
            dir.path().join("b.yaml").display()
        )));
    }

    #[test]
    fn an_empty_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), ".only-hidden.yaml", A);
        write(dir.path(), "notes.txt", "");
        let shown = dir.path().display().to_string();
        assert_eq!(
            messages(load_path(dir.path()).unwrap_err()),
            [format!(
                "{shown}: no config files (*.yaml, *.yml) in {shown}"
            )]
        );
    }

    #[test]
    fn a_missing_path_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let found = messages(load_path(&missing).unwrap_err());
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with(&format!("{}: cannot read: ", missing.display())));
    }

    #[test]
    fn duplicate_domains_across_files_point_at_the_later_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "1.yaml", A);
        write(dir.path(), "2.yaml", "# again\ndomain: a\n");
        assert_eq!(
            messages(load_path(dir.path()).unwrap_err()),
            [format!(
                "{}:2:9: duplicate domain `a`: already defined at {}:1:9",
                dir.path().join("2.yaml").display(),
                dir.path().join("1.yaml").display()
            )]
        );
    }

    #[test]
    fn invalid_utf8_is_located() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("a.yaml"), b"domain: a\n# caf\xe9\n").unwrap();
        assert_eq!(
            messages(load_path(dir.path()).unwrap_err()),
            [format!(
                "{}:2:6: file is not valid UTF-8",
                dir.path().join("a.yaml").display()
            )]
        );
    }
}
