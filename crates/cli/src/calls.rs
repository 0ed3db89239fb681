//! `cumux calls`: which driver calls cumux's client answers and which it
//! refuses, from the census the bindings generator writes (`docs/driver-calls.md`).

use anyhow::{bail, Result};
use cumux_cuda_bindings::census::{ANSWERED, REFUSED};

/// What `cumux calls` prints.
#[derive(clap::Args, Debug)]
pub struct CallsOptions {
    /// Only the calls cumux refuses (CUDA_ERROR_NOT_SUPPORTED).
    #[arg(long, conflicts_with = "answered")]
    pub refused: bool,
    /// Only the calls cumux answers.
    #[arg(long)]
    pub answered: bool,
    /// Driver symbols to look up by their exact names (`cuMemAlloc_v2`);
    /// every symbol when none is given.
    pub names: Vec<String>,
}

/// How the client takes `symbol`: `Some("answered")`, `Some("refused")`, or
/// `None` for a name NVIDIA's driver does not export.
pub fn status_of(symbol: &str) -> Option<&'static str> {
    if ANSWERED.contains(&symbol) {
        Some("answered")
    } else if REFUSED.contains(&symbol) {
        Some("refused")
    } else {
        None
    }
}

/// The lines `cumux calls` prints for `options`.
pub fn lines(options: &CallsOptions) -> Result<Vec<String>> {
    let wanted = |status: &str| match (options.answered, options.refused) {
        (true, _) => status == "answered",
        (_, true) => status == "refused",
        _ => true,
    };
    if !options.names.is_empty() {
        let mut out = Vec::new();
        for name in &options.names {
            match status_of(name) {
                Some(status) if wanted(status) => out.push(format!("{status:<9} {name}")),
                Some(_) => {}
                None => bail!("{name:?} is not a symbol of NVIDIA's driver (CUDA 13.0 and 13.5)"),
            }
        }
        return Ok(out);
    }
    let mut listed: Vec<(&str, &str)> = [("answered", ANSWERED), ("refused", REFUSED)]
        .into_iter()
        .filter(|(status, _)| wanted(status))
        .flat_map(|(status, symbols)| symbols.iter().map(move |s| (*s, status)))
        .collect();
    listed.sort_unstable();
    let mut out: Vec<String> = listed
        .into_iter()
        .map(|(symbol, status)| format!("{status:<9} {symbol}"))
        .collect();
    out.push(format!(
        "{} answered, {} refused of {} driver symbols",
        ANSWERED.len(),
        REFUSED.len(),
        ANSWERED.len() + REFUSED.len()
    ));
    Ok(out)
}

/// Prints the census (see [`lines`]).
pub fn run(options: CallsOptions) -> Result<()> {
    for line in lines(&options)? {
        println!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(names: &[&str], refused: bool) -> CallsOptions {
        CallsOptions {
            refused,
            answered: false,
            names: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn names_are_looked_up_and_unknown_ones_refused() {
        let found = lines(&options(&["cuMemAlloc_v2", "cuGLInit"], false)).unwrap();
        assert_eq!(found, ["answered  cuMemAlloc_v2", "refused   cuGLInit"]);
        assert!(lines(&options(&["cuNoSuchCall"], false)).is_err());
    }

    #[test]
    fn the_whole_list_counts_every_symbol_once() {
        let all = lines(&options(&[], false)).unwrap();
        assert_eq!(all.len(), ANSWERED.len() + REFUSED.len() + 1);
        let refused = lines(&options(&[], true)).unwrap();
        assert_eq!(refused.len(), REFUSED.len() + 1);
        assert!(refused[..REFUSED.len()]
            .iter()
            .all(|l| l.starts_with("refused ")));
    }
}
