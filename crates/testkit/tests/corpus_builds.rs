//! Every program of the CUDA corpus compiles with nvcc's default flags, both to
//! PTX and to a complete executable, and the build cache returns the same paths
//! on a second call instead of recompiling.

use std::fs;

fn corpus_sources() -> Vec<std::path::PathBuf> {
    let mut sources: Vec<_> = fs::read_dir(cumux_testkit::corpus_dir())
        .expect("tests/cuda/corpus exists")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cu"))
        .collect();
    sources.sort();
    sources
}

#[test]
fn corpus_has_the_documented_programs() {
    let readme = fs::read_to_string(cumux_testkit::corpus_dir().join("README.md")).unwrap();
    let sources = corpus_sources();
    assert!(sources.len() >= 20, "{} programs", sources.len());
    for source in &sources {
        let file = source.file_name().unwrap().to_string_lossy();
        assert!(
            readme.contains(&format!("`{file}`")),
            "README.md does not describe {file}"
        );
    }
}

#[test]
fn every_corpus_program_compiles_to_ptx() {
    for source in corpus_sources() {
        let ptx = cumux_testkit::compile_ptx(&source);
        assert!(ptx.contains(".entry"), "{} has no kernel", source.display());
        assert!(ptx.contains(".target sm_75"), "default architecture");
    }
}

#[test]
fn every_corpus_program_builds_and_the_cache_holds() {
    for source in corpus_sources() {
        let first = cumux_testkit::compile_program(&source, &[]);
        assert!(first.is_file());
        assert!(fs::metadata(&first).unwrap().len() > 0);
        let modified = fs::metadata(&first).unwrap().modified().unwrap();
        let second = cumux_testkit::compile_program(&source, &[]);
        assert_eq!(first, second);
        assert_eq!(fs::metadata(&second).unwrap().modified().unwrap(), modified);
    }
}

#[test]
fn different_flags_get_different_cache_entries() {
    let source = cumux_testkit::corpus_source("vector_add");
    let default = cumux_testkit::compile_ptx(&source);
    let sm80 = cumux_testkit::compile_ptx_with(&source, &["-arch=sm_80"]);
    assert!(default.contains(".target sm_75"));
    assert!(sm80.contains(".target sm_80"));
}
