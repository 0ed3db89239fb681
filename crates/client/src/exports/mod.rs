//! The C ABI: one exported function per driver symbol. Bodies are thin; they
//! check and convert arguments and call into `state`. Every body runs inside
//! `guard`, so no panic crosses the ABI.

pub(crate) use crate::abi::*;
use crate::errors::*;

/// Defines exported driver functions. `fn a | b (args) { body }` exports the
/// same body under each name (the `_ptds`/`_ptsz` forms share the legacy
/// form's signature). The body returns `CuResult<()>`. Each export is checked
/// at compile time against its C signature in the headers
/// (`cumux_cuda_bindings::pfn`): a parameter of another type or count does
/// not build. `unchecked fn` leaves out the check, for a symbol whose
/// signature no header here gives (`cumux_cuda_bindings::pfn` lists them).
macro_rules! driver_fn {
    () => {};
    (unchecked fn $name:ident ($($sig:tt)*) $body:block $($rest:tt)*) => {
        driver_fn!(@export $name ($($sig)*) $body);
        driver_fn!($($rest)*);
    };
    (fn $name:ident $(| $alias:ident)* ($($sig:tt)*) $body:block $($rest:tt)*) => {
        driver_fn!(@def $name ($($sig)*) $body);
        driver_fn!(@aliases $name ($($sig)*) $($alias)*);
        driver_fn!($($rest)*);
    };
    (@def $name:ident ($($sig:tt)*) $body:block) => {
        driver_fn!(@export $name ($($sig)*) $body);
        const _: cumux_cuda_bindings::pfn::$name = $name;
    };
    (@export $name:ident ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        #[no_mangle]
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::errors::CUresult {
            $crate::abi::guard(stringify!($name), move || $body)
        }
    };
    (@aliases $name:ident $sig:tt $($alias:ident)*) => {
        $( driver_fn!(@alias $name $alias $sig); )*
    };
    (@alias $name:ident $alias:ident ($($arg:ident: $ty:ty),* $(,)?)) => {
        #[no_mangle]
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $crate::errors::CUresult {
            $name($($arg),*)
        }
        const _: cumux_cuda_bindings::pfn::$alias = $alias;
    };
}

/// Defines one exported stub per driver symbol cumux does not implement: it
/// says so on stderr the first time it is called and returns
/// `CUDA_ERROR_NOT_SUPPORTED`. Arguments are ignored, which the C calling
/// convention allows.
macro_rules! not_implemented_stubs {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            #[allow(non_snake_case)]
            pub extern "C" fn $name() -> $crate::errors::CUresult {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| $crate::errors::report_not_implemented(stringify!($name)));
                $crate::errors::CUDA_ERROR_NOT_SUPPORTED
            }
        )*
    };
}
pub(crate) use not_implemented_stubs;

mod context;
mod copy;
mod cuda13x;
mod device;
mod function;
mod graph;
mod init;
mod launch;
mod memory;
mod module;
mod occupancy;
mod proc_address;
mod stream;
#[path = "../generated/stubs.rs"]
mod stubs;
mod sync;
mod tensor_map;

pub use context::*;
pub use copy::*;
pub use cuda13x::*;
pub use device::*;
pub use function::*;
pub use graph::*;
pub use init::*;
pub use launch::*;
pub use memory::*;
pub use module::*;
pub use occupancy::*;
pub use proc_address::*;
pub use stream::*;
pub use stubs::*;
pub use tensor_map::*;
