//! Fat binaries, as `cuModuleLoadData` hands them over: the fatbin crate's
//! parser (sizes, entries, LZ4 and Zstandard payloads, ELF sizes) and the
//! server's own reading of a module image (`ptx_of_image`) must answer any
//! bytes with a value or an error, never a panic. Seeds are the fatbin
//! crate's fixtures and the images inside them.

use std::mem::discriminant;
use std::path::Path;

use cumux_fatbin::{best_ptx, classify, elf_size, fatbin_size, images, ImageKind};
use cumux_server::device::cpu::ptx_of_image;

use crate::engine::{corpus_files, Target};
use crate::features::Features;

pub static TARGET: Target = Target {
    name: "fatbin",
    check,
    seeds,
    dictionary: &[
        &[0x50, 0xed, 0x55, 0xba],
        &[0xb1, 0x43, 0x62, 0x46],
        &[0x7f, b'E', b'L', b'F'],
        &[0x01, 0x00],
        &[0x02, 0x00],
        &[0x00, 0x20],
        &[0x00, 0x80],
        &[0x40, 0x00, 0x00, 0x00],
        &[0x00, 0x00, 0x00, 0x40],
        b".version 8.5\n.target sm_75\n",
    ],
    max_len: 16 << 10,
};

fn check(data: &[u8], features: &mut Features) {
    features.add(("class", format!("{:?}", classify(data))));
    match fatbin_size(data) {
        Ok(size) => features.add(("size fits", size <= data.len())),
        Err(e) => features.add(("size error", discriminant(&e))),
    }
    match images(data) {
        Ok(found) => {
            features.add(("images", found.len().min(8)));
            for image in &found {
                // Architectures past any real one count as one.
                features.add(("image", image.kind == ImageKind::Ptx, image.sm.min(200)));
                if image.kind == ImageKind::Ptx {
                    assert_ne!(image.data.last(), Some(&0), "PTX keeps no trailing NUL");
                }
            }
        }
        Err(e) => features.add(("images error", discriminant(&e))),
    }
    features.add(("best ptx", best_ptx(data).is_some()));
    features.add(("elf", elf_size(data).is_ok()));
    match ptx_of_image(data) {
        Ok(text) => features.add(("ptx of image", text.len().min(4))),
        Err(e) => features.add(("ptx of image", e.code)),
    }
}

/// The fixtures and each image inside them (cubins are ELF files).
fn seeds() -> Vec<Vec<u8>> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fatbin/tests/fixtures");
    let mut out: Vec<Vec<u8>> = corpus_files(&fixtures)
        .into_iter()
        .filter(|(path, _)| path.extension().is_some_and(|e| e == "fatbin"))
        .map(|(_, bytes)| bytes)
        .collect();
    let inner: Vec<Vec<u8>> = out
        .iter()
        .filter_map(|f| images(f).ok())
        .flatten()
        .map(|image| image.data)
        .collect();
    out.extend(inner);
    out
}
