//! Graph conditional nodes' device side: a conditional handle is the device
//! address of a 32-bit word, and `cudaGraphSetConditional` (which NVIDIA's
//! driver links into modules itself) becomes a PTX function of the module
//! that stores its value there.
//!
//! A module that calls it is loaded from its PTX with that definition in
//! place of the `.extern` declaration. A module that names it but has no PTX
//! (a cubin alone) is refused: its calls would reach the driver's own
//! function with a handle the driver never made. Compressed images are
//! looked into only once the program has made a conditional handle (the
//! runtime loads a program's modules lazily, at first use, so after that),
//! to spare every other program decompressing its modules' PTX.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::errors::*;

/// Whether the program has made a conditional handle.
static USED: AtomicBool = AtomicBool::new(false);

/// The program makes a conditional handle: modules loaded from now on are
/// looked into, compressed or not.
pub fn used() {
    USED.store(true, Ordering::Relaxed);
}

/// The device function kernels call to set a condition.
const SET_CONDITIONAL: &str = "cudaGraphSetConditional";

/// The definition that replaces the driver's: `*(u32 *)handle = value`.
const DEFINITION: &str = "
{
\t.reg .b64 %cumux_cond_handle;
\t.reg .b32 %cumux_cond_value;
\tld.param.b64 %cumux_cond_handle, [cudaGraphSetConditional_param_0];
\tld.param.b32 %cumux_cond_value, [cudaGraphSetConditional_param_1];
\tst.global.b32 [%cumux_cond_handle], %cumux_cond_value;
\tret;
}";

/// `image` as it should be loaded: unchanged unless it names
/// `cudaGraphSetConditional`, then its PTX with the function defined.
pub fn resolve(image: Vec<u8>) -> CuResult<Vec<u8>> {
    if !mentions(&image) {
        return Ok(image);
    }
    let ptx = match cumux_fatbin::classify(&image) {
        cumux_fatbin::Classified::Ptx => {
            let end = image.iter().position(|b| *b == 0).unwrap_or(image.len());
            String::from_utf8(image[..end].to_vec()).ok()
        }
        cumux_fatbin::Classified::Fatbin => cumux_fatbin::best_ptx(&image),
        _ => None,
    };
    let Some(defined) = ptx.as_deref().and_then(define) else {
        tracing::warn!(
            "a module calls {SET_CONDITIONAL} but carries no PTX to give it cumux's \
             conditional handles: not loaded (build it with PTX, e.g. -arch=sm_XX without \
             code=, to use conditional graph nodes through cumux)"
        );
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    };
    let mut bytes = defined.into_bytes();
    bytes.push(0);
    Ok(bytes)
}

/// Whether the bytes name the function anywhere (PTX text or an ELF's
/// string table), or, once conditionals are used, a fat binary's PTX does.
fn mentions(image: &[u8]) -> bool {
    // Every module load passes here, PyTorch's hundreds of MB among them:
    // a vectorised search.
    memchr::memmem::find(image, SET_CONDITIONAL.as_bytes()).is_some()
        || USED.load(Ordering::Relaxed)
            && cumux_fatbin::classify(image) == cumux_fatbin::Classified::Fatbin
            && cumux_fatbin::best_ptx(image).is_some_and(|p| p.contains(SET_CONDITIONAL))
}

/// `ptx` with its `.extern .func cudaGraphSetConditional(…);` declaration
/// made a definition; `None` without one.
fn define(ptx: &str) -> Option<String> {
    let at = ptx.find(&format!(".extern .func {SET_CONDITIONAL}"))?;
    let close = at + ptx[at..].find(')')?;
    let semicolon = close + ptx[close..].find(';')?;
    let declaration = &ptx[at + ".extern ".len()..=close];
    Some(format!(
        "{}{declaration}{DEFINITION}{}",
        &ptx[..at],
        &ptx[semicolon + 1..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALLER: &str = "//\n.version 8.0\n.target sm_75\n.address_size 64\n\n\
        .extern .func cudaGraphSetConditional\n(\n\t.param .b64 cudaGraphSetConditional_param_0,\n\
        \t.param .b32 cudaGraphSetConditional_param_1\n)\n;\n\n.visible .entry k()\n{\n\tret;\n}\n";

    #[test]
    fn the_declaration_becomes_a_definition_and_the_rest_stays() {
        let out = String::from_utf8(resolve(CALLER.as_bytes().to_vec()).unwrap()).unwrap();
        assert!(!out.contains(".extern"), "{out}");
        assert!(out.contains(".func cudaGraphSetConditional\n(\n"), "{out}");
        assert!(out.contains("st.global.b32 [%cumux_cond_handle]"), "{out}");
        assert!(out.contains(".visible .entry k()"), "{out}");
        assert!(out.ends_with("}\n\0"), "{out:?}");
    }

    #[test]
    fn other_modules_pass_untouched_and_a_cubin_that_calls_it_is_refused() {
        let plain = b"//\n.version 8.0\n.target sm_75\n".to_vec();
        assert_eq!(resolve(plain.clone()).unwrap(), plain);
        let mut cubin = vec![0x7f, b'E', b'L', b'F', 2, 1, 1];
        cubin.extend_from_slice(b"\0cudaGraphSetConditional\0");
        assert_eq!(resolve(cubin), Err(CUDA_ERROR_NOT_SUPPORTED));
    }
}
