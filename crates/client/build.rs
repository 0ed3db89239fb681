//! The client driver is loaded as `libcuda.so.1`; give it that soname so
//! programs linked against it (`-lcuda`) ask for `libcuda.so.1` at run time.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
