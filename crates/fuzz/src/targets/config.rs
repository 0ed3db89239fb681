//! The server's config file (`cumux serve --config FILE`): any text parses to
//! settings or an error, never a panic; settings that parse give every
//! device a policy and admit or refuse any tenant name without panicking. The
//! byte-size and duration syntaxes get each line of the text as well.

use cumux_cli::config::{parse, parse_bytes, parse_duration};
use cumux_server::Policy;

use crate::engine::Target;
use crate::features::Features;

pub static TARGET: Target = Target {
    name: "config",
    check,
    seeds,
    dictionary: &[
        b"device = \"cpu\"\n",
        b"listen = \"unix:/tmp/cumux.sock\"\n",
        b"memory = \"16G\"\n",
        b"memory = 18446744073709551615\n",
        b"launch_budget = 0\n",
        b"policy = \"fair\"\n",
        b"sharing = \"shared\"\n",
        b"kernel_timeout = \"1h 30m\"\n",
        b"allow_unknown = false\n",
        b"[defaults]\n",
        b"[tenants.alice]\n",
        b"[devices.1]\n",
        b"memory_quota = \"512MiB\"\n",
        b"weight = 0\n",
        b"class = \"latency-critical\"\n",
        b"devices = [0, 4294967295]\n",
        b"uids = [1000]\n",
        b"\"",
        b"[",
        b"]",
        b"=",
        b"\n",
        b"99999999999999999999T",
        b"{ policy = \"priority\" }",
    ],
    max_len: 4096,
};

fn check(data: &[u8], features: &mut Features) {
    // Mutations break UTF-8 often; the text is what matters.
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();
    for line in text.lines().take(64) {
        let value = line
            .rsplit('=')
            .next()
            .unwrap_or(line)
            .trim()
            .trim_matches('"');
        features.add(("bytes", parse_bytes(value).is_ok()));
        features.add(("duration", parse_duration(value).is_ok()));
    }
    let config = match parse(text) {
        Ok(config) => config,
        Err(e) => {
            features.add_message("refused", root_cause(&format!("{e:#}")));
            return;
        }
    };
    features.add(("tenants", config.tenants.tenants.len().min(4)));
    features.add(("allow unknown", config.tenants.allow_unknown));
    for count in [0, 1, 4] {
        match config.devices.policies(Policy::Fifo, count) {
            Ok(policies) => assert_eq!(policies.len(), count, "a policy per device"),
            Err(e) => features.add_message("policies", root_cause(&format!("{e:#}"))),
        }
        features.add(("beyond", count, config.devices.beyond(count).len().min(4)));
    }
    let names: Vec<String> = config.tenants.tenants.keys().cloned().collect();
    for name in names
        .iter()
        .map(String::as_str)
        .chain(["", "default", "x\u{7}"])
    {
        for uid in [None, Some(0), Some(1000)] {
            let admitted = config.tenants.admit(Some(name), uid, None);
            features.add(("admit", admitted.is_ok()));
        }
    }
    features.add((
        "admit by uid",
        config.tenants.admit(None, Some(1000), None).is_ok(),
    ));
}

/// Why a config was refused, without where: the last line of the message (a
/// TOML error shows the source first), after the last `: ` of the chain.
fn root_cause(message: &str) -> &str {
    let last = message
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    last.rsplit(": ").next().unwrap_or(last)
}

/// The documented example, and small ones.
fn seeds() -> Vec<Vec<u8>> {
    [
        "device = \"auto\"\nlisten = \"unix:/run/cumux/cumux.sock\"\nmemory = \"16G\"\n\
         policy = \"fair\"\nsharing = \"shared\"\nkernel_timeout = \"30s\"\n\
         allow_unknown = false\n[defaults]\nmemory_quota = \"1G\"\n[tenants.alice]\n\
         memory_quota = \"8G\"\nweight = 2\nclass = \"latency-critical\"\ndevices = [0]\n\
         uids = [1000]\n[devices.1]\npolicy = \"priority\"\n",
        "memory = 4096\nlaunch_budget = 1000000\n",
        "[tenants.bob]\nweight = 3\nclass = \"batch\"\n[tenants.carol]\nmemory_quota = 65536\n",
        "[devices.0]\npolicy = \"fifo\"\n[devices.7]\n",
        "",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}
