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
