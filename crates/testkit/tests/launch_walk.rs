//! Keeps ARCHITECTURE.md's launch walk true: every step names files of the
//! tree and functions those files define, and a launch crosses at most 8 steps.

use std::fs;
use std::path::{Path, PathBuf};

/// The most steps a launch may take from `cuLaunchKernel` to the backend.
const MAX_STEPS: usize = 8;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The numbered steps under "**A launch**", each as its text.
fn walk_steps(architecture: &str) -> Vec<String> {
    let start = architecture
        .find("- **A launch**")
        .expect("ARCHITECTURE.md describes a launch's walk");
    let rest = &architecture[start..];
    let end = rest[2..].find("\n- **").map_or(rest.len(), |i| i + 2);
    let mut steps: Vec<String> = Vec::new();
    for line in rest[..end].lines().skip(1) {
        let trimmed = line.trim_start();
        let numbered = trimmed
            .split_once(". ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        match (numbered, steps.last_mut()) {
            (true, _) => steps.push(trimmed.to_string()),
            (false, Some(step)) => {
                step.push(' ');
                step.push_str(trimmed);
            }
            (false, None) => {}
        }
    }
    steps
}

/// Every `` `crates/….rs` `fn name` `` pair a step names.
fn named_functions(step: &str) -> Vec<(String, String)> {
    let quoted: Vec<&str> = step.split('`').skip(1).step_by(2).collect();
    quoted
        .windows(2)
        .filter(|w| w[0].starts_with("crates/") && w[0].ends_with(".rs"))
        .filter_map(|w| {
            let name = w[1].strip_prefix("fn ")?;
            Some((w[0].to_string(), name.to_string()))
        })
        .collect()
}

fn defines(source: &str, name: &str) -> bool {
    ["(", "<"]
        .iter()
        .any(|next| source.contains(&format!("fn {name}{next}")))
}

#[test]
fn the_documented_launch_walk_is_real_and_short() {
    let root = repo_root();
    let architecture = fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let steps = walk_steps(&architecture);
    assert!(
        (2..=MAX_STEPS).contains(&steps.len()),
        "a launch walks {} steps (at most {MAX_STEPS}):\n{}",
        steps.len(),
        steps.join("\n")
    );
    let mut problems = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let named = named_functions(step);
        if named.is_empty() {
            problems.push(format!("step {} names no `file` `fn function`", i + 1));
        }
        for (file, function) in named {
            match fs::read_to_string(root.join(&file)) {
                Ok(source) if defines(&source, &function) => {}
                Ok(_) => problems.push(format!("{file} defines no fn {function}")),
                Err(e) => problems.push(format!("{file}: {e}")),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_walk_reader_finds_steps_and_their_functions() {
    let text = "- **A launch** walks:\n  1. `crates/a.rs` `fn one`: x\n     and `crates/b.rs`\n     `fn two`;\n  2. `crates/c.rs` `fn three`\n- **Next** thing\n  3. not a step\n";
    let steps = walk_steps(text);
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert_eq!(
        named_functions(&steps[0]),
        vec![
            ("crates/a.rs".to_string(), "one".to_string()),
            ("crates/b.rs".to_string(), "two".to_string())
        ]
    );
    assert!(defines("impl X { pub fn two<T>(t: T) {} }", "two"));
    assert!(!defines("fn twofold() {}", "two"));
}
