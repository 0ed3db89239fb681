//! Names and printf detection on fat binaries nvcc built from corpus programs.

use cumux_cuda_driver::capture::image_may_print;
use cumux_cuda_driver::image::{check_image, code_choice, image_names, ImageKind};
use cumux_cuda_driver::CodeChoice;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}.fatbin",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn printf_is_detected_only_where_kernels_print() {
    assert!(image_may_print(&fixture("printf_kernel")));
    assert!(!image_may_print(&fixture("constant_and_device_globals")));
    assert!(!image_may_print(&fixture("device_function")));
}

#[test]
fn module_variables_are_found_by_name() {
    let image = fixture("constant_and_device_globals");
    assert_eq!(check_image(&image), Ok(ImageKind::Fatbin));
    let names = image_names(&image);
    assert_eq!(
        names.variables,
        ["coefficients", "negative_count", "offsets"]
    );
    assert_eq!(names.kernels, ["_Z10polynomialPKiPii"]);
    assert_eq!(code_choice(&image, 90), CodeChoice::PtxJit { sm: 75 });
    assert_eq!(code_choice(&image, 75), CodeChoice::Cubin { sm: 75 });
}

#[test]
fn kernels_and_device_functions_are_candidates() {
    let names = image_names(&fixture("device_function"));
    assert!(names
        .kernels
        .iter()
        .any(|k| k == "_Z15device_functionPKiPiPyS1_i"));
    assert!(names.variables.is_empty());
}

#[test]
fn damaged_images_are_refused_or_read_without_a_panic() {
    let image = fixture("printf_kernel");
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for round in 0..2000 {
        let mut bytes = image.clone();
        // xorshift: flip a few bytes, sometimes cut the image short.
        for _ in 0..1 + round % 4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = (state % bytes.len() as u64) as usize;
            bytes[at] ^= (state >> 32) as u8 | 1;
        }
        if round % 5 == 0 {
            bytes.truncate((state >> 8) as usize % bytes.len());
        }
        let _ = check_image(&bytes);
        let _ = image_names(&bytes);
        let _ = code_choice(&bytes, 90);
        let _ = image_may_print(&bytes);
    }
}
