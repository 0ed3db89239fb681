//! A worker process's context as a [`MovableContext`] (issue 17): a moved
//! session's memory placed, its modules loaded and its facts asked of the worker.

use cumux_protocol::{CuError, DevicePtr};

use super::context::{unexpected, WorkerContext};
use super::wire::{WorkerRequest, WorkerValue};
use crate::device::{LoadedModule, ModuleId, MovableContext};

/// What a worker says of its context for a move: its address window, its
/// limits, and why it cannot move, if it cannot.
type MoveFacts = (u32, Vec<(u32, u64)>, Option<String>);

impl WorkerContext {
    /// Makes the worker's context hand out addresses in `window` (its first
    /// request: a fresh context for a moved session).
    pub fn take_window(&self, window: u32) -> Result<(), CuError> {
        self.unit(&WorkerRequest::Window { window }, &[])
    }

    /// The worker's window, limits and refusal; an unreachable worker is
    /// its own refusal.
    fn move_facts(&self) -> Result<MoveFacts, CuError> {
        match self.call(&WorkerRequest::MoveFacts, &[], None)? {
            WorkerValue::MoveFacts {
                window,
                limits,
                unmovable,
            } => Ok((window, limits, unmovable)),
            other => Err(unexpected(&other)),
        }
    }
}

impl MovableContext for WorkerContext {
    fn window(&self) -> u32 {
        self.move_facts().map_or(0, |f| f.0)
    }

    fn alloc_at(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        self.place_all(&[(ptr, bytes)])
    }

    fn place_all(&self, allocations: &[(DevicePtr, u64)]) -> Result<(), CuError> {
        let request = WorkerRequest::Place {
            allocations: allocations.to_vec(),
        };
        self.unit(&request, &[])?;
        self.charge(
            allocations
                .iter()
                .fold(0u64, |sum, a| sum.saturating_add(a.1)),
        );
        Ok(())
    }

    fn hold(&self, ranges: &[(DevicePtr, u64)]) -> Result<(), CuError> {
        let request = WorkerRequest::Hold {
            ranges: ranges.to_vec(),
        };
        self.unit(&request, &[])
    }

    fn keep_free(&self, spans: &[(u64, u64)]) -> Result<u64, CuError> {
        let request = WorkerRequest::KeepFree {
            spans: spans.to_vec(),
        };
        self.number(&request)
    }

    fn module_blocks(&self, module: ModuleId) -> Vec<DevicePtr> {
        let Some(local) = self.local_module(module) else {
            return Vec::new();
        };
        match self.call(&WorkerRequest::ModuleBlocks { module: local }, &[], None) {
            Ok(WorkerValue::Ptrs(blocks)) => blocks,
            _ => Vec::new(),
        }
    }

    /// One request for all; a module the worker does not know has none.
    fn modules_blocks(&self, modules: &[ModuleId]) -> Vec<Vec<DevicePtr>> {
        let local: Vec<Option<ModuleId>> = modules.iter().map(|&m| self.local_module(m)).collect();
        let known: Vec<ModuleId> = local.iter().flatten().copied().collect();
        let request = WorkerRequest::ModulesBlocks { modules: known };
        let mut lists = match self.call(&request, &[], None) {
            Ok(WorkerValue::PtrLists(lists)) => lists.into_iter(),
            _ => Vec::new().into_iter(),
        };
        local
            .iter()
            .map(|m| match m {
                Some(_) => lists.next().unwrap_or_default(),
                None => Vec::new(),
            })
            .collect()
    }

    fn module_load_at(&self, image: &[u8], blocks: &[DevicePtr]) -> Result<LoadedModule, CuError> {
        self.load_module(image, Some(blocks))
    }

    fn export_placed(&self, ptr: DevicePtr) -> Result<(u64, u64, std::os::fd::OwnedFd), CuError> {
        match self.call_for_fd(&WorkerRequest::PlacedExport { ptr })? {
            (WorkerValue::Range { base, size }, Some(fd)) => Ok((base, size, fd)),
            (WorkerValue::Range { .. }, None) => Err(CuError::new(
                cumux_protocol::codes::UNKNOWN,
                "the worker exported no descriptor",
            )),
            (other, _) => Err(unexpected(&other)),
        }
    }

    fn unmovable(&self) -> Option<String> {
        match self.move_facts() {
            Ok((_, _, why)) => why,
            Err(e) => Some(format!("its worker cannot say what it holds: {}", e.detail)),
        }
    }

    fn limits(&self) -> Vec<(u32, u64)> {
        self.move_facts().map(|f| f.1).unwrap_or_default()
    }
}
