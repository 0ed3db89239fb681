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

/// Takes every symbol a driver exports, as the generator lists them
/// (`generated/symbols.rs`): `implemented { .. }` (defined in these modules)
/// and `stubs { .. }`. Defines one exported stub per symbol cumux does not
/// implement: it says so on stderr the first time it is called and returns
/// `CUDA_ERROR_NOT_SUPPORTED` (arguments are ignored, which the C calling
/// convention allows). And `symbol_address`, a match over every symbol.
macro_rules! driver_symbols {
    (implemented { $($implemented:ident,)* } stubs { $($stub:ident,)* }) => {
        $(
            #[no_mangle]
            #[allow(non_snake_case)]
            pub extern "C" fn $stub() -> $crate::errors::CUresult {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| $crate::errors::report_not_implemented(stringify!($stub)));
                $crate::errors::CUDA_ERROR_NOT_SUPPORTED
            }
        )*

        /// The address of an exported driver symbol by its exact name
        /// (`cuMemAlloc_v2`), implemented or stubbed.
        pub fn symbol_address(symbol: &str) -> Option<*const std::ffi::c_void> {
            let f: *const std::ffi::c_void = match symbol {
                $(stringify!($implemented) => super::$implemented as *const std::ffi::c_void,)*
                $(stringify!($stub) => $stub as *const std::ffi::c_void,)*
                _ => return None,
            };
            Some(f)
        }
    };
}
pub(crate) use driver_symbols;

mod array;
mod array_descs;
mod context;
mod copy;
mod cuda13x;
mod device;
mod function;
mod graph;
mod graph_allocs;
mod graph_conditional;
mod graph_memory;
mod graph_nodes;
mod graph_queries;
mod graph_update;
mod init;
mod ipc;
mod launch;
mod managed_hints;
mod memory;
mod module;
mod occupancy;
mod pool_ipc;
mod pools;
mod proc_address;
mod stream;
#[path = "../generated/symbols.rs"]
mod symbols;
mod sync;
mod tensor_map;
mod vmm;

pub use array::*;
pub use context::*;
pub use copy::*;
pub use cuda13x::*;
pub use device::*;
pub use function::*;
pub use graph::*;
pub use graph_conditional::*;
pub use graph_memory::*;
pub use graph_nodes::*;
pub use graph_queries::*;
pub use graph_update::*;
pub use init::*;
pub use ipc::*;
pub use launch::*;
pub use managed_hints::*;
pub use memory::*;
pub use module::*;
pub use occupancy::*;
pub use pools::*;
pub use proc_address::*;
pub use stream::*;
pub use symbols::*;
pub use tensor_map::*;
pub use vmm::*;
