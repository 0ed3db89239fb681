//! What a launch's blocks leave behind, shared by the interpreter and the
//! compiler: each block's printf output, the lowest faulting block's fault,
//! and the workers the blocks are spread over.

use std::sync::Mutex;

use crate::launch::{Fault, LaunchReport};

#[derive(Default)]
pub(crate) struct BlockResults {
    fault: Mutex<Option<(u64, Fault)>>,
    outputs: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl BlockResults {
    /// Keeps `e`, the fault of block `id`, if no lower block faulted.
    pub(crate) fn fault(&self, id: u64, e: Fault) {
        let mut f = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        if f.as_ref().is_none_or(|(b, _)| id < *b) {
            *f = Some((id, e));
        }
    }

    /// A worker's blocks' output, by block id.
    pub(crate) fn outputs(&self, outs: Vec<(u64, Vec<u8>)>) {
        self.outputs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(outs);
    }

    /// The launch's report: output block by block in block order (as the
    /// device prints it, up to `printf_limit` bytes), the fault kept, the
    /// count.
    pub(crate) fn report(self, instructions: u64, printf_limit: usize) -> LaunchReport {
        let mut outs = self.outputs.into_inner().unwrap_or_else(|e| e.into_inner());
        outs.sort_by_key(|(id, _)| *id);
        let mut stdout: Vec<u8> = Vec::new();
        for (_, o) in outs {
            if stdout.len() + o.len() > printf_limit {
                break;
            }
            stdout.extend_from_slice(&o);
        }
        let result = match self.fault.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some((_, f)) => Err(f),
            None => Ok(()),
        };
        LaunchReport {
            stdout,
            instructions,
            result,
        }
    }
}

/// Runs `work(k)` for each worker `k`, on threads of their own when more than one.
pub(crate) fn on_workers(workers: usize, work: &(dyn Fn(u32) + Sync)) {
    if workers == 1 {
        work(0);
        return;
    }
    std::thread::scope(|s| {
        for k in 0..workers {
            s.spawn(move || work(k as u32));
        }
    });
}
