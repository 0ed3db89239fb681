//! Fences the PTX file named by the first argument and prints the result
//! (or why it cannot be fenced): `cargo run -p cumux-ptx-fence --example fence_file F`.

fn main() {
    let path = std::env::args().nth(1).expect("a PTX file");
    let text = std::fs::read_to_string(&path).expect("readable PTX");
    match cumux_ptx_fence::fence_ptx(&text) {
        Ok(fenced) => print!("{}", fenced.ptx),
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    }
}
