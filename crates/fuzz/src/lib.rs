//! Fuzzing on stable Rust: every parser a client or an operator can feed (the
//! wire decoder, the shared-memory ring, a session's dispatch, PTX, fat
//! binaries, the config file, function plans) as a [`Target`], and one seeded mutate-from-corpus
//! loop ([`engine`]) that runs them for a bounded time and keeps every crash as
//! a file of the target's corpus folder, replayed by `tests/fuzz_corpus.rs`.

pub mod engine;
pub mod features;
pub mod mutate;
pub mod panics;
pub mod targets;

pub use engine::{corpus_root, Crash, Run, RunOptions, RunStats, Target};
pub use features::Features;
