//! The `CUdevice_attribute` values a CPU-side device reports: every attribute of
//! CUDA 13.0's `cuda.h` (1 ..= 147), shaped like a compute-capability-7.5 GPU;
//! and what a GPU's own values become through cumux ([`as_served`]).

/// The last attribute number CUDA 13.0 defines
/// (`CU_DEVICE_ATTRIBUTE_ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED`).
pub const LAST_ATTRIBUTE: u32 = 147;

/// The compute capability a CPU-side device reports (major, minor): the
/// interpreter runs the PTX of this architecture and below; a fat binary
/// with only newer PTX runs its lowest (`cpu::ptx_of_image`).
pub const COMPUTE_CAPABILITY: (i32, i32) = (7, 5);

/// Threads and blocks one multiprocessor holds at once.
const THREADS_PER_SM: i32 = 1024;
const BLOCKS_PER_SM: i32 = 16;

/// The most multiprocessors a CPU-side device reports: a cooperative launch
/// may hold every block the device holds at once (multiprocessors × 16
/// blocks, × 1,024 threads), and the interpreter runs at most
/// `MAX_COOPERATIVE_BLOCKS` blocks and `MAX_COOPERATIVE_THREADS` threads
/// at once (a host with more cores still uses them all; a test checks the
/// bound against `ptx`'s).
pub const MAX_MULTIPROCESSORS: i32 = 64;

/// Threads per block, as on every GPU since Fermi.
pub const MAX_THREADS_PER_BLOCK: i32 = 1024;
/// Static shared memory a block may use without opting in.
pub const SHARED_PER_BLOCK: i32 = 48 << 10;
/// Shared memory a block may use after opting in (sm_75: 64 KiB; we offer 99 KiB),
/// and the block and grid limits: the launch checks' own defaults.
pub use cumux_protocol::launch_checks::{MAX_BLOCK_DIM, MAX_GRID_DIM, SHARED_PER_BLOCK_OPTIN};

/// Capabilities a GPU has that a program does not get through cumux, so a
/// program told of them would choose a path that then fails: GPUDirect RDMA
/// (a NIC cannot reach device memory through the client), shareable handles
/// other than file descriptors (for virtual memory and memory pools alike),
/// multicast objects,
/// host NUMA virtual memory, and managed memory the device and the host use
/// concurrently or through the host's page tables (cumux keeps managed memory
/// coherent at synchronization points only).
const NOT_SERVED: [u32; 15] = [
    88,  // PAGEABLE_MEMORY_ACCESS
    89,  // CONCURRENT_MANAGED_ACCESS
    100, // PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES
    101, // DIRECT_MANAGED_MEM_ACCESS_FROM_HOST
    104, // HANDLE_TYPE_WIN32_HANDLE_SUPPORTED
    105, // HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED
    110, // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    116, // GPU_DIRECT_RDMA_SUPPORTED
    117, // GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS
    118, // GPU_DIRECT_RDMA_WRITES_ORDERING
    128, // HANDLE_TYPE_FABRIC_SUPPORTED
    132, // MULTICAST_SUPPORTED
    141, // HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    143, // HOST_NUMA_MULTINODE_IPC_SUPPORTED
    161, // GPU_DIRECT_RDMA_WITH_LOCALIZED_MEMORY_SUPPORTED
];

/// A GPU's attributes as a program sees the GPU through cumux: its own
/// values, but 0 for the capabilities cumux does not give ([`NOT_SERVED`]).
pub fn as_served(mut attributes: Vec<(u32, i32)>) -> Vec<(u32, i32)> {
    for (attr, value) in &mut attributes {
        if NOT_SERVED.contains(attr) {
            *value = 0;
        }
        if *attr == MEMPOOL_SUPPORTED_HANDLE_TYPES {
            // Pools shareable as file descriptors only (the client's
            // `exports::pool_ipc`), as virtual memory is.
            *value &= POSIX_FD;
        }
    }
    attributes
}

/// The CPU device's attributes where its contexts live in worker processes
/// (`worker-cpu`): its handles for memory and events between programs name
/// objects of one process, so it offers none (file descriptors, pool
/// handle types, IPC events read 0).
pub fn cpu_in_workers(attrs: &mut [(u32, i32)]) {
    for (attr, value) in attrs {
        if matches!(*attr, 103 | MEMPOOL_SUPPORTED_HANDLE_TYPES | 125) {
            *value = 0;
        }
    }
}

/// `CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES`.
const MEMPOOL_SUPPORTED_HANDLE_TYPES: u32 = 119;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const POSIX_FD: i32 = 1;

/// What the table depends on.
#[derive(Debug, Clone, Copy)]
pub struct AttributeInputs {
    pub multiprocessors: i32,
    pub pci: [u32; 3],
}

/// One value for every attribute 1 ..= [`LAST_ATTRIBUTE`].
pub fn cpu_device_attributes(inputs: AttributeInputs) -> Vec<(u32, i32)> {
    (1..=LAST_ATTRIBUTE)
        .map(|attr| (attr, value(attr, inputs)))
        .collect()
}

fn value(attr: u32, inputs: AttributeInputs) -> i32 {
    let [domain, bus, device] = inputs.pci.map(|v| i32::try_from(v).unwrap_or(0));
    match attr {
        1 => MAX_THREADS_PER_BLOCK,
        2..=4 => MAX_BLOCK_DIM[(attr - 2) as usize],
        5..=7 => MAX_GRID_DIM[(attr - 5) as usize],
        8 => SHARED_PER_BLOCK,
        9 => 64 << 10,   // total constant memory
        10 => 32,        // warp size
        11 => i32::MAX,  // max pitch
        12 => 65536,     // registers per block
        13 => 1_590_000, // clock rate, kHz
        14 => 512,       // texture alignment
        15 => 1,         // gpu overlap
        16 => inputs.multiprocessors.clamp(1, MAX_MULTIPROCESSORS),
        17 => 0,          // kernel exec timeout
        18 => 0,          // integrated
        19 => 1,          // can map host memory
        20 => 0,          // compute mode: default
        21 => 131072,     // texture 1D width
        22 | 23 => 65536, // texture 2D
        24..=26 => 16384, // texture 3D
        27 | 28 => 32768, // texture 2D layered
        29 => 2048,       // layers
        30 => 512,        // surface alignment
        31 => 1,          // concurrent kernels
        32 => 0,          // ECC
        33 => bus,
        34 => device,
        35 => 0,         // TCC
        36 => 5_001_000, // memory clock, kHz
        37 => 256,       // bus width, bits
        38 => 4 << 20,   // L2
        39 => THREADS_PER_SM,
        40 => 2,          // async engines
        41 => 1,          // unified addressing
        42 => 32768,      // texture 1D layered width
        43 => 2048,       // layers
        44 => 0,          // deprecated
        45 | 46 => 32768, // texture 2D gather
        47..=49 => 8192,  // texture 3D alternate
        50 => domain,
        51 => 32,         // texture pitch alignment
        52 | 53 => 32768, // cubemap
        54 => 2046,       // cubemap layers
        55 => 32768,      // surface 1D
        56 | 57 => 65536, // surface 2D
        58 | 59 => 16384, // surface 3D
        60 => 16384,
        61 => 32768, // surface 1D layered
        62 => 2048,
        63 | 64 => 32768, // surface 2D layered
        65 => 2048,
        66 | 67 => 32768, // surface cubemap
        68 => 2046,
        69 => 1 << 27,     // texture 1D linear (deprecated)
        70 | 71 => 131072, // texture 2D linear
        72 => 2 << 20,     // texture 2D linear pitch
        73 | 74 => 32768,  // texture 2D mipmapped
        75 => COMPUTE_CAPABILITY.0,
        76 => COMPUTE_CAPABILITY.1,
        77 => 32768,    // texture 1D mipmapped
        78 => 1,        // stream priorities
        79 | 80 => 1,   // L1 caching of globals / locals
        81 => 64 << 10, // shared memory per SM
        82 => 65536,    // registers per SM
        83 => 1,        // managed memory
        84 => 0,        // multi-GPU board
        85 => 0,
        86 => 0,      // host native atomics
        87 => 32,     // single/double perf ratio
        88 => 0,      // pageable memory access
        89 => 0,      // concurrent managed access
        90 => 1,      // compute preemption
        91 => 0,      // host pointer for registered mem
        92..=94 => 0, // stream mem ops v1
        95 => 1,      // cooperative launch
        96 => 0,      // cooperative multi-device (deprecated)
        97 => SHARED_PER_BLOCK_OPTIN,
        98 => 0, // flush remote writes
        99 => 1, // host register
        100 | 101 => 0,
        102 => 1,       // virtual memory management (cuMemCreate, cuMemMap …)
        103 => 1,       // POSIX file descriptors (`cpu::vmm_export`, in process)
        104 | 105 => 0, // Win32 handles
        106 => BLOCKS_PER_SM,
        107 => 0, // compression
        108 => 0, // persisting L2
        109 => 0, // access policy window
        110 => 0,
        111 => 0, // reserved shared memory per block
        112 | 113 => 0,
        114 => 0,
        115 => 1,        // memory pools (the client's, of ordinary device memory)
        116..=118 => 0,  // GPUDirect RDMA
        119 => POSIX_FD, // mempool handle types: the client's pools over VMM
        120 => 0,        // cluster launch (sm_90+)
        121 => 0,
        122 | 123 => 0, // stream mem ops
        124 => 0,       // dma-buf
        125 => 1,       // IPC events (`threads::ordered`, in process)
        126 => 1,       // memory sync domains
        127 => 0,       // tensor maps (sm_90+)
        128 => 0,       // fabric handles
        129 => 0,       // unified function pointers
        130 => 0,       // NUMA config: none
        131 => -1,      // NUMA id
        132 => 0,       // multicast
        133 => 0,       // MPS
        134 => -1,      // host NUMA id
        135..=138 => 0,
        139 => 0x1eb8_10de, // PCI device id | vendor id (NVIDIA)
        140 => 0,
        141..=147 => 0,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_cumux_does_not_give_read_as_absent() {
        let gpu: Vec<(u32, i32)> = (1..=LAST_ATTRIBUTE).map(|a| (a, 1)).collect();
        let served = as_served(gpu);
        let value = |attr: u32| served.iter().find(|(a, _)| *a == attr).map(|(_, v)| *v);
        assert_eq!(value(110), Some(0), "GPUDirect RDMA with VMM");
        assert_eq!(value(89), Some(0), "concurrent managed access");
        assert_eq!(value(102), Some(1), "virtual memory management is served");
        assert_eq!(value(1), Some(1));
    }

    #[test]
    fn every_attribute_has_a_value() {
        let attrs = cpu_device_attributes(AttributeInputs {
            multiprocessors: 6,
            pci: [0, 0x42, 0],
        });
        assert_eq!(attrs.len(), LAST_ATTRIBUTE as usize);
        assert!(attrs
            .iter()
            .enumerate()
            .all(|(i, (a, _))| *a == i as u32 + 1));
        let get = |n: u32| attrs[n as usize - 1].1;
        assert_eq!(get(1), 1024);
        assert_eq!(get(10), 32);
        assert_eq!(get(16), 6);
        assert_eq!(get(33), 0x42);
        assert_eq!((get(75), get(76)), (7, 5));
        assert_eq!(get(97), 99 << 10);
        assert_eq!(get(41), 1);
    }

    /// Every block the device says it holds at once fits a cooperative
    /// launch on the interpreter, however many cores the host has.
    #[cfg(feature = "cpu")]
    #[test]
    fn a_full_cooperative_grid_fits_the_interpreter() {
        let attrs = cpu_device_attributes(AttributeInputs {
            multiprocessors: 4096,
            pci: [0, 0, 0],
        });
        let get = |n: u32| attrs[n as usize - 1].1 as u64;
        let sms = get(16);
        assert_eq!(sms, MAX_MULTIPROCESSORS as u64);
        assert!(sms * get(106) <= cumux_ptx::MAX_COOPERATIVE_BLOCKS);
        assert!(sms * get(39) <= cumux_ptx::MAX_COOPERATIVE_THREADS);
    }
}
