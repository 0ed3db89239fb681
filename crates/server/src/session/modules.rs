//! A session's modules: loading an image on its context (kernels and globals
//! become the session's handles, globals count against the quota) and
//! unloading it, with the graphs of its kernels.

use cumux_protocol::{FunctionInfo, GlobalInfo, Handle, ModuleInfo, ReplyBody};

use super::core::invalid_handle;
use super::{CallResult, FunctionEntry, ModuleEntry, Session};

impl Session {
    pub(super) fn module_load(&mut self, image: Vec<u8>) -> CallResult {
        let loaded = self.ctx.module_load(&image)?;
        // Module globals are device memory too: they count against the quota.
        let global_bytes = loaded
            .globals
            .iter()
            .fold(0u64, |sum, g| sum.saturating_add(g.size));
        if let Err(e) = self.reserve(global_bytes) {
            self.ctx.module_unload(loaded.id);
            return Err(e);
        }
        let module = self.mint_handle();
        if global_bytes > 0 {
            self.module_bytes.insert(module, global_bytes);
        }
        let mut functions = Vec::with_capacity(loaded.kernels.len());
        let mut infos = Vec::with_capacity(loaded.kernels.len());
        for (index, kernel) in loaded.kernels.into_iter().enumerate() {
            let handle = self.mint_handle();
            infos.push(FunctionInfo {
                name: kernel.name.clone(),
                handle,
                params: kernel.params.clone(),
                attrs: kernel.attrs,
            });
            functions.push(handle);
            self.functions.insert(
                handle,
                FunctionEntry {
                    module: loaded.id,
                    index,
                    desc: kernel,
                },
            );
        }
        for g in &loaded.globals {
            if g.size > 0 {
                self.globals.insert(g.ptr, g.size);
            }
        }
        self.modules.insert(
            module,
            ModuleEntry {
                id: loaded.id,
                functions,
                globals: loaded.globals.iter().map(|g| g.ptr).collect(),
                image: std::sync::Arc::new(image),
            },
        );
        tracing::debug!(
            session = self.id(),
            module,
            kernels = infos.len(),
            "module loaded"
        );
        Ok(ReplyBody::Module(ModuleInfo {
            module,
            functions: infos,
            globals: loaded
                .globals
                .into_iter()
                .map(|g| GlobalInfo {
                    name: g.name,
                    ptr: g.ptr,
                    size: g.size,
                })
                .collect(),
        }))
    }

    pub(super) fn module_unload(&mut self, module: Handle) -> CallResult {
        if !self.modules.contains_key(&module) {
            return Err(invalid_handle("module", module));
        }
        self.drain_all();
        if let Some(entry) = self.modules.remove(&module) {
            self.drop_module(entry);
        }
        if let Some(bytes) = self.module_bytes.remove(&module) {
            self.release(bytes);
        }
        Ok(ReplyBody::Unit)
    }

    pub(super) fn drop_module(&mut self, entry: ModuleEntry) {
        for f in &entry.functions {
            self.functions.remove(f);
        }
        for g in &entry.globals {
            self.globals.remove(g);
            self.aliases.forget_current(*g);
        }
        // Graphs of its kernels go with it: launching one later would run
        // kernels the device no longer has.
        let stale: Vec<Handle> = self
            .graphs
            .iter()
            .filter(|(_, launches)| launches.iter().any(|l| l.module == entry.id))
            .map(|(graph, _)| *graph)
            .collect();
        for graph in stale {
            self.graphs.remove(&graph);
            if let Ok(ordered) = self.ordered() {
                ordered.graph_destroy(graph);
            }
        }
        self.ctx.module_unload(entry.id);
    }
}
