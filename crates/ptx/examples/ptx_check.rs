//! Loads PTX files on the reference device and reports their kernels or the
//! first error: `cargo run -p cumux-ptx --example ptx_check -- a.ptx b.ptx`.

fn main() {
    let mut failed = false;
    for path in std::env::args().skip(1) {
        let src = match std::fs::read_to_string(&path) {
            Ok(s) => s,
            Err(e) => {
                println!("{path}: {e}");
                failed = true;
                continue;
            }
        };
        let mem = cumux_ptx::DeviceMemory::new(1 << 30);
        match cumux_ptx::Program::load(&src, &mem) {
            Ok(p) => {
                let names: Vec<&str> = p.kernels().iter().map(|k| k.name.as_str()).collect();
                println!("{path}: ok, kernels {names:?}");
            }
            Err(e) => {
                println!("{path}: {e}");
                failed = true;
            }
        }
    }
    std::process::exit(i32::from(failed));
}
