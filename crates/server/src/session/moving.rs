//! Moving a session (issue 17): an admin's order carried out between two of
//! its calls — its work drained, its state taken as a [`SessionImage`] and
//! rebuilt on a fresh context (another device's, or from a checkpoint) with
//! every handle and pointer its client holds; then the old context goes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use cumux_protocol::{codes, CuError, DevicePtr, Handle};

use super::aliases::Aliases;
use super::checkpoints::FromContext;
use super::core::{err, release_failed};
use super::image::{
    Allocation, Bytes, GraphImage, LaunchImage, ModuleImage, SessionImage, StreamImage,
};
use super::memory_pipe::{self, Buffers, MemorySource};
use super::order::{stream_order, Order};
use super::preparing::{ModuleToLoad, Prepared, Preparing, ROUNDS};
use super::{launch_meter, FunctionEntry, ModuleEntry, Session};
use crate::device::placed_copy::SourceMapping;
use crate::device::{
    placed_copy, Device, DeviceContext, KernelLaunch, LoadedModule, ModuleId, MovableContext,
    StreamOrdered, StreamWork,
};
use crate::gate::{GateSession, SchedStreams};
use crate::moves::{Action, Order as AdminOrder};

/// A session's state rebuilt on a new context, not yet the session's.
struct Rebuilt {
    /// How long its parts took, said in the move's line.
    timings: String,
    device: Arc<dyn Device>,
    ctx: Arc<dyn DeviceContext>,
    order: Order,
    gate: Option<Arc<GateSession>>,
    /// Each module handle's loading on the new context.
    loaded: HashMap<Handle, LoadedModule>,
    /// Globals put elsewhere on the new context, from their old addresses.
    moved: Aliases,
    /// The session's aliases once it has moved.
    aliases: Aliases,
    /// The target's memory as the old context mapped it, to unmap later.
    early_mapping: Vec<SourceMapping>,
}

/// A moved session's old context with what it still holds: its modules
/// unloaded, its memory freed and the context ended when this is dropped.
struct OldContext {
    ctx: Arc<dyn DeviceContext>,
    modules: Vec<ModuleId>,
    memory: Vec<(DevicePtr, u64)>,
    session: u64,
    /// The new context's memory as this one mapped it for the move.
    early_mapping: Vec<SourceMapping>,
}

impl Drop for OldContext {
    fn drop(&mut self) {
        // The new context's memory, mapped here for the move, first.
        drop(std::mem::take(&mut self.early_mapping));
        for &module in &self.modules {
            self.ctx.module_unload(module);
        }
        for &(ptr, size) in &self.memory {
            if let Err(e) = self.ctx.mem_free(ptr, size) {
                release_failed(
                    self.session,
                    format_args!("freeing {ptr:#x} after a move"),
                    &e,
                );
            }
        }
    }
}

fn refused(why: impl Into<String>) -> CuError {
    err(codes::NOT_SUPPORTED, why)
}

impl Session {
    /// Carries out the order an admin left for this session, if any: at the
    /// start of a call, when none of its calls is half done.
    /// An answer comes back where the order settles the call itself (a
    /// held session that moved away).
    pub(super) fn take_order(&mut self) -> Option<super::CallResult> {
        if self.preparing.as_ref().is_some_and(|p| p.is_ready()) {
            if let Some(preparing) = self.preparing.take() {
                let (order, ordinal, round, target, prepared) = preparing.finish();
                match prepared {
                    // Modules the program loaded meanwhile: another round.
                    Ok(p) if round < ROUNDS && self.modules_to_load(Some(&p)).next().is_some() => {
                        self.prepare_round(order, ordinal, target, Some((round, p)));
                    }
                    prepared => {
                        let answer = self.finish_move(ordinal, target, prepared);
                        self.answer(order, answer.map(String::into_bytes));
                    }
                }
            }
        }
        let order = self.server.orders().take(self.id())?;
        if self.preparing.is_some() {
            let busy = err(
                codes::NOT_READY,
                format!("session {} is being moved already", self.id()),
            );
            // The move under way keeps the session's status note.
            let _ = order.answer.send(Err(busy));
            return None;
        }
        if matches!(order.action, Action::Hold(_)) {
            return self.hold(order);
        }
        let answer = match &order.action {
            &Action::MoveTo(device) => match self.move_target(device) {
                // The target is made ready first: answered when the move is done.
                Ok(target) => {
                    self.prepare_round(order, device, target, None);
                    return None;
                }
                Err(e) => Err(e),
            },
            Action::Hold(_) => Err(err(codes::UNKNOWN, "a hold is answered by the hold itself")),
            Action::Checkpoint(file) => self
                .quiesced_image("checkpointed")
                .and_then(|image| self.checkpoint_into(&image, file.as_ref())),
            Action::Restore(from) => self.restore(from).map(String::into_bytes),
        };
        self.answer(order, answer);
        None
    }

    /// Answers an admin's order.
    fn answer(&mut self, order: AdminOrder, answer: Result<Vec<u8>, CuError>) {
        if let Err(e) = &answer {
            tracing::warn!(
                session = self.id(),
                "an admin's order was refused: {}",
                e.detail
            );
        }
        let orders = self.server.orders();
        orders.count_answer(order.action.kind(), answer.is_ok());
        orders.done(self.id());
        // The admin may have stopped waiting; the session carries on either way.
        let _ = order.answer.send(answer);
    }

    /// Why this session cannot move or be checkpointed now, if it cannot.
    fn why_unmovable(&self) -> Option<String> {
        if self.ctx.movable().is_none() {
            return Some(
                "its context cannot be laid out again elsewhere (a context shared by several \
                 sessions)"
                    .into(),
            );
        }
        if self.group.as_ref().is_some_and(|g| g.member_count() > 1) {
            return Some("it is one of several devices of its program".into());
        }
        if !self.ipc_opened.is_empty() || self.server.ipc().issued_by(self.id()) {
            return Some("it shares memory or events with another program (IPC handles)".into());
        }
        if !self.vmm.is_empty() {
            return Some("it holds virtual memory (cuMemCreate, cuMemMap)".into());
        }
        if !self.arrays.is_empty() {
            return Some("it holds CUDA arrays or texture or surface objects".into());
        }
        if let Some(why) = self.ctx.movable().and_then(|m| m.unmovable()) {
            return Some(why);
        }
        if let Some(fatal) = self.core.fatal() {
            return Some(format!("it failed: {}", fatal.detail));
        }
        // A new context would run on the whole GPU: the cap must not be lost
        // without a word.
        if let Some(percent) = self.tenant.as_ref().and_then(|(_, s)| s.sm_percent) {
            return Some(format!(
                "its tenant's SM cap (sm_percent = {percent}) does not follow a session to a new context yet"
            ));
        }
        None
    }

    /// The session's state once its work has drained.
    pub(super) fn quiesced_image(&mut self, what: &str) -> Result<SessionImage, CuError> {
        self.quiesced_image_timed(what).map(|(image, _)| image)
    }

    /// [`Session::quiesced_image`], with how long its work took to drain.
    fn quiesced_image_timed(
        &mut self,
        what: &str,
    ) -> Result<(SessionImage, std::time::Duration), CuError> {
        if let Some(why) = self.why_unmovable() {
            return Err(refused(format!(
                "session {} cannot be {what}: {why}",
                self.id()
            )));
        }
        let draining = std::time::Instant::now();
        self.drain_all();
        let drained = draining.elapsed();
        Ok((self.image()?, drained))
    }

    /// `Action::MoveTo`, first half: the server's device `ordinal`, which
    /// this session may move to.
    fn move_target(&self, ordinal: u32) -> Result<Arc<dyn Device>, CuError> {
        let target = self
            .server
            .devices()
            .get(ordinal as usize)
            .cloned()
            .ok_or_else(|| {
                err(
                    codes::INVALID_DEVICE,
                    format!("the server has no device {ordinal}"),
                )
            })?;
        if Arc::ptr_eq(&target, &self.device) {
            return Err(err(
                codes::INVALID_VALUE,
                format!("session {} is on device {ordinal} already", self.id()),
            ));
        }
        if let Some(failure) = self.server.health().failure(ordinal) {
            return Err(refused(format!(
                "device {ordinal} has failed: {}",
                failure.reason
            )));
        }
        if let Some((name, settings)) = &self.tenant {
            // The reserve is every tenant's, for moves off a failed device.
            let allowed = self.server.health().is_reserve(ordinal)
                || settings
                    .devices
                    .as_ref()
                    .is_none_or(|d| d.contains(&ordinal));
            if !allowed {
                return Err(refused(format!(
                    "tenant {name:?} may not use device {ordinal}"
                )));
            }
        }
        if let Some(why) = self.why_unmovable() {
            return Err(refused(format!(
                "session {} cannot be moved: {why}",
                self.id()
            )));
        }
        Ok(target)
    }

    /// The modules of this session that `prepared` has not loaded (all,
    /// without one), as the target loads them.
    fn modules_to_load<'a>(
        &'a self,
        prepared: Option<&'a Prepared>,
    ) -> impl Iterator<Item = ModuleToLoad> + 'a {
        self.modules
            .iter()
            .filter(move |(handle, _)| prepared.is_none_or(|p| !p.loaded.contains_key(handle)))
            .map(|(&handle, entry)| {
                let blocks = self
                    .ctx
                    .movable()
                    .map(|m| m.module_blocks(entry.id))
                    .unwrap_or_default();
                (handle, Arc::clone(&entry.image), blocks)
            })
    }

    /// Starts a round of making device `ordinal` ready: the context and
    /// every module (`base`: none yet), else the modules `base` lacks.
    fn prepare_round(
        &mut self,
        order: AdminOrder,
        ordinal: u32,
        target: Arc<dyn Device>,
        base: Option<(u32, Prepared)>,
    ) {
        let window = self.ctx.movable().map_or(0, |m| m.window());
        let modules: Vec<ModuleToLoad> =
            self.modules_to_load(base.as_ref().map(|b| &b.1)).collect();
        let count = modules.len();
        // The session's memory; on a base, what it allocated since the
        // base placed its own.
        let placed: HashSet<(DevicePtr, u64)> = base
            .as_ref()
            .map(|b| b.1.placed.iter().copied().collect())
            .unwrap_or_default();
        let memory: Vec<(DevicePtr, u64)> = self
            .allocations
            .iter()
            .map(|(&p, &s)| (p, s))
            .filter(|a| !placed.contains(a))
            .collect();
        let devices = (target, Arc::clone(&self.ctx));
        match Preparing::start(order, ordinal, devices, window, (modules, memory), base) {
            Ok(preparing) => {
                let note = format!(
                    "move to device {ordinal}: making the target ready (round {}, {count} modules)",
                    preparing.round
                );
                self.server.orders().note(self.id(), note);
                self.preparing = Some(preparing);
            }
            Err((order, e)) => self.answer(order, Err(e)),
        }
    }

    /// `Action::MoveTo`, second half: the session moved to `target` (device
    /// `ordinal`), onto the context made ready for it if that worked, else a
    /// fresh one.
    fn finish_move(
        &mut self,
        ordinal: u32,
        target: Arc<dyn Device>,
        prepared: Result<Prepared, CuError>,
    ) -> Result<String, CuError> {
        let from = self.device.info().ordinal;
        let started = std::time::Instant::now();
        let (image, drained) = self.quiesced_image_timed("moved")?;
        let read = started.elapsed().saturating_sub(drained);
        let bytes = image.charged_bytes();
        let ready = match prepared {
            Ok(ref p) => format!("target made ready beforehand in {:.1?}", p.took),
            Err(ref e) => format!("target not made ready beforehand: {}", e.detail),
        };
        // The bytes go from the old context to the new one piece by piece.
        let mut memory = FromContext::new(self.ctx.as_ref());
        let mut rebuilt = match prepared {
            Ok(p) => self
                .rebuild(Arc::clone(&target), &image, Some(p), &mut memory)
                .or_else(|e| {
                    tracing::info!("the move's prepared target failed ({}); again", e.detail);
                    self.rebuild(target, &image, None, &mut memory)
                })?,
            Err(_) => self.rebuild(target, &image, None, &mut memory)?,
        };
        let timings = std::mem::take(&mut rebuilt.timings);
        self.adopt(rebuilt, image);
        let line = format!(
            "session {} moved from device {from} to device {ordinal} in {:.1?} ({bytes} bytes; \
             drained in {drained:.1?}, its state read in {read:.1?}; {timings}; {ready})",
            self.id(),
            started.elapsed()
        );
        tracing::info!("{line}");
        Ok(line)
    }

    /// The session's state replaced by `image`'s, its memory's bytes from
    /// `memory`.
    pub(super) fn restore_image(
        &mut self,
        image: SessionImage,
        memory: &mut dyn MemorySource,
    ) -> Result<String, CuError> {
        if image.index != self.index {
            return Err(err(
                codes::INVALID_VALUE,
                format!(
                    "the checkpoint is of its program's device {}, this session is its device {}",
                    image.index, self.index
                ),
            ));
        }
        if let Some(why) = self.why_unmovable() {
            return Err(refused(format!(
                "session {} cannot be restored: {why}",
                self.id()
            )));
        }
        self.drain_all();
        let held = self
            .allocations
            .values()
            .chain(self.module_bytes.values())
            .fold(0u64, |sum, b| sum.saturating_add(*b));
        let wanted = image.charged_bytes();
        if wanted > held {
            self.reserve(wanted - held)?;
        }
        let device = Arc::clone(&self.device);
        match self.rebuild(device, &image, None, memory) {
            Ok(mut rebuilt) => {
                if held > wanted {
                    self.release(held - wanted);
                }
                let memory = image.allocations.len();
                let timings = std::mem::take(&mut rebuilt.timings);
                self.adopt(rebuilt, image);
                Ok(format!(
                    "session {} restored: {memory} allocations, {wanted} bytes ({timings})",
                    self.id()
                ))
            }
            Err(e) => {
                if wanted > held {
                    self.release(wanted - held);
                }
                Err(e)
            }
        }
    }

    /// The session's state as data (its memory's bytes stay on the
    /// device); its work has drained.
    fn image(&self) -> Result<SessionImage, CuError> {
        let window = self
            .ctx
            .movable()
            .map(|m| m.window())
            .ok_or_else(|| refused("the context cannot be moved"))?;
        let allocations = self
            .allocations
            .iter()
            .map(|(&ptr, &size)| Allocation { ptr, size })
            .collect();
        // Every module's globals read, and its blocks asked, at once.
        let entries: Vec<(&Handle, &ModuleEntry)> = self.modules.iter().collect();
        let spans: Vec<Vec<(DevicePtr, u64)>> = entries
            .iter()
            .map(|(_, entry)| {
                entry
                    .globals
                    .iter()
                    .filter_map(|ptr| self.globals.get(ptr).map(|size| (*ptr, *size)))
                    .collect()
            })
            .collect();
        let all: Vec<(DevicePtr, u64)> = spans.iter().flatten().copied().collect();
        let mut read = self.ctx.mem_read_spans(&all)?.into_iter();
        let ids: Vec<ModuleId> = entries.iter().map(|(_, e)| e.id).collect();
        let blocks = self
            .ctx
            .movable()
            .map(|m| m.modules_blocks(&ids))
            .unwrap_or_else(|| vec![Vec::new(); ids.len()]);
        let mut modules = Vec::with_capacity(entries.len());
        for (((&handle, entry), spans), blocks) in entries.into_iter().zip(spans).zip(blocks) {
            let globals = spans
                .iter()
                .map(|&(ptr, _)| Bytes {
                    ptr,
                    bytes: read.next().unwrap_or_default(),
                })
                .collect();
            modules.push(ModuleImage {
                handle,
                image: Arc::clone(&entry.image),
                blocks,
                functions: entry.functions.clone(),
                globals,
                charged: self.module_bytes.get(&handle).copied().unwrap_or(0),
            });
        }
        modules.sort_by_key(|m| m.handle);
        let module_of: HashMap<u64, Handle> =
            self.modules.iter().map(|(h, m)| (m.id, *h)).collect();
        let mut graphs = Vec::with_capacity(self.graphs.len());
        for (&handle, launches) in &self.graphs {
            let launches = launches
                .iter()
                .map(|l| {
                    let module = module_of
                        .get(&l.module)
                        .copied()
                        .ok_or_else(|| err(codes::UNKNOWN, "a graph of an unloaded module"))?;
                    Ok(LaunchImage {
                        module,
                        kernel: l.kernel as u64,
                        geometry: l.geometry.clone(),
                        params: l.params.clone(),
                    })
                })
                .collect::<Result<Vec<_>, CuError>>()?;
            graphs.push(GraphImage { handle, launches });
        }
        let mut streams: Vec<StreamImage> = self
            .streams
            .iter()
            .map(|(&handle, &(flags, priority))| StreamImage {
                handle,
                flags,
                priority,
            })
            .collect();
        streams.sort_by_key(|s| s.handle);
        let mut events: Vec<(Handle, u32)> = self.events.iter().map(|(h, f)| (*h, *f)).collect();
        events.sort_unstable();
        Ok(SessionImage {
            format: super::image::IMAGE_FORMAT,
            index: self.index,
            window,
            next_handle: self.next_handle,
            allocations,
            modules,
            streams,
            events,
            graphs,
            limits: self.ctx.movable().map(|m| m.limits()).unwrap_or_default(),
            aliases: self.aliases.entries(),
            resume: None,
        })
    }

    /// `image` on a fresh context of `device`, beside the session's own,
    /// its memory's bytes from `memory`: on any failure (a checkpoint's
    /// checksum included) the new context goes and the session is as it was.
    fn rebuild(
        &self,
        device: Arc<dyn Device>,
        image: &SessionImage,
        prepared: Option<Prepared>,
        memory: &mut dyn MemorySource,
    ) -> Result<Rebuilt, CuError> {
        check_handles(image)?;
        let (ctx, mut ready, placed_early, early_mapping) = match prepared {
            Some(p) => (p.ctx, p.loaded, p.placed, p.mapping),
            None => (
                device
                    .movable()
                    .ok_or_else(|| refused("the target device cannot take a moved session"))?
                    .create_context_in_window(image.window)?,
                HashMap::new(),
                Vec::new(),
                Vec::new(),
            ),
        };
        let placed = ctx
            .movable()
            .ok_or_else(|| refused("the target context cannot place memory"))?;
        for &(limit, value) in &image.limits {
            ctx.set_limit(limit, value)?;
        }
        // Pinned host memory the program registered, as the old context had it.
        self.host.register_again(&*ctx)?;
        let total = image.charged_bytes();
        let places: Vec<(DevicePtr, u64)> =
            image.allocations.iter().map(|a| (a.ptr, a.size)).collect();
        let placing = std::time::Instant::now();
        let kept_early = placed_copy::place_changes(ctx.as_ref(), placed, &placed_early, &places)?;
        let placed_in = placing.elapsed();
        let mut done = 0u64;
        let ordinal = device.info().ordinal;
        let direct = memory.context().map(|source| {
            let note = format!("rebuilding on device {ordinal}: {total} bytes device to device");
            self.server.orders().note(self.id(), note);
            // Mapped beforehand: good where what it was mapped for is kept.
            let early = (early_mapping.as_slice(), kept_early.as_slice());
            placed_copy::copy_placed_after(source, placed, &places, early)
        });
        let (copied, path) = match direct {
            Some(Ok(_)) => (true, "device to device".to_string()),
            Some(Err(e)) => (false, format!("through the server: {}", e.detail)),
            None => (false, "through the server".to_string()),
        };
        if !copied {
            // Pieces are written into the new context while the next are read.
            let buffers = Buffers::default();
            memory_pipe::write_behind(ctx.as_ref(), &buffers, &mut |put| {
                memory.pour(&places, &buffers, &mut |at, piece| {
                    done += piece.len();
                    put(at, piece)?;
                    let note = format!("rebuilding on device {ordinal}: {done} of {total} bytes");
                    self.server.orders().note(self.id(), note);
                    Ok(())
                })
            })?;
        }
        memory.finish()?;
        let written = placing.elapsed();
        let loading = std::time::Instant::now();
        let mut loaded_now = 0usize;
        let mut loaded = HashMap::with_capacity(image.modules.len());
        // Globals the target's driver put elsewhere: from where they were
        // (`moved`), and from the program's addresses (`aliases`).
        let mut moved = Aliases::default();
        // The image's own: a session restored on another server starts
        // with none of its own.
        let mut aliases = Aliases::from_entries(&image.aliases);
        // Every module's globals, written at once after the loads.
        let mut writes: Vec<(DevicePtr, &[u8])> = Vec::new();
        for m in &image.modules {
            let module = match ready.remove(&m.handle) {
                Some(module) => module,
                None => {
                    loaded_now += 1;
                    placed.module_load_at(&m.image, &m.blocks)?
                }
            };
            if module.kernels.len() != m.functions.len() {
                return Err(err(
                    codes::INVALID_IMAGE,
                    format!(
                        "module {} has {} kernels now",
                        m.handle,
                        module.kernels.len()
                    ),
                ));
            }
            let fresh: Vec<_> = module.globals.iter().filter(|g| g.size > 0).collect();
            let same_shape = fresh.len() == m.globals.len()
                && fresh
                    .iter()
                    .zip(&m.globals)
                    .all(|(new, old)| new.size == old.bytes.len() as u64);
            if !same_shape {
                return Err(err(
                    codes::INVALID_IMAGE,
                    format!("module {}'s globals are not those it had", m.handle),
                ));
            }
            for (new, old) in fresh.into_iter().zip(&m.globals) {
                writes.push((new.ptr, old.bytes.as_slice()));
                if new.ptr != old.ptr {
                    moved.moved(old.ptr, new.size, new.ptr);
                    aliases.moved(old.ptr, new.size, new.ptr);
                }
            }
            loaded.insert(m.handle, module);
        }
        ctx.mem_write_spans(&writes)?;
        // Modules made ready for the move and unloaded since.
        for (_, module) in ready {
            ctx.module_unload(module.id);
        }
        self.hold_aliases(placed, &aliases, image, &loaded)?;
        let modules_ready = loading.elapsed();
        let remaking = std::time::Instant::now();
        let (gate, gated) = match (&self.tenant, self.server.gate_of(&device)) {
            (Some((name, settings)), Some(gate)) => {
                let session = gate
                    .join(name, settings, self.id())
                    .map_err(|e| err(codes::OUT_OF_MEMORY, format!("scheduler: {e}")))?;
                (Some(Arc::new(session)), true)
            }
            _ => (None, false),
        };
        let order = stream_order(
            &ctx,
            self.id(),
            self.entry.is_some(),
            gate.as_ref(),
            || launch_meter(&self.core.stats, self.account.as_ref(), gated),
            self.forced_priority,
            self.latency_critical,
        )?;
        let ordered: &dyn StreamOrdered = match (&order.threads, ctx.stream_ordered()) {
            (Some(threads), _) => threads,
            (None, Some(own)) => own,
            (None, None) => return Err(err(codes::UNKNOWN, "no stream order")),
        };
        for s in &image.streams {
            ordered.stream_create(s.handle, s.flags, s.priority)?;
        }
        for &(event, flags) in &image.events {
            ordered.event_create(event, flags)?;
        }
        for g in &image.graphs {
            let works = g
                .launches
                .iter()
                .map(|l| launch_of(&loaded, l, &moved).map(StreamWork::Launch))
                .collect::<Result<Vec<_>, _>>()?;
            ordered.graph_create(g.handle, works)?;
        }
        let timings = format!(
            "memory placed in {placed_in:.1?} ({} of {} allocations placed beforehand) and \
             written in {:.1?} ({path}), {loaded_now} of {} modules \
             loaded and their globals written in {modules_ready:.1?}, {} streams, {} events and \
             {} graphs made in {:.1?}",
            kept_early.len(),
            places.len(),
            written.saturating_sub(placed_in),
            image.modules.len(),
            image.streams.len(),
            image.events.len(),
            image.graphs.len(),
            remaking.elapsed()
        );
        Ok(Rebuilt {
            timings,
            device,
            ctx,
            order,
            gate,
            loaded,
            moved,
            aliases,
            early_mapping,
        })
    }

    /// Keeps the program's addresses of globals now elsewhere unused on the
    /// new context (reserved, so they fault rather than reach memory
    /// allocated later), refusing the move where one of them is taken.
    fn hold_aliases(
        &self,
        placed: &dyn MovableContext,
        aliases: &Aliases,
        image: &SessionImage,
        loaded: &HashMap<Handle, LoadedModule>,
    ) -> Result<(), CuError> {
        let ranges: Vec<(DevicePtr, u64)> = aliases.program_ranges().collect();
        if ranges.is_empty() {
            return Ok(());
        }
        let taken = image.allocations.iter().map(|a| (a.ptr, a.size)).chain(
            loaded
                .values()
                .flat_map(|m| m.globals.iter().map(|g| (g.ptr, g.size))),
        );
        for (base, size) in taken {
            if let Some(&(p, b)) = ranges
                .iter()
                .find(|&&(p, b)| p < base.saturating_add(size) && base < p.saturating_add(b))
            {
                return Err(refused(format!(
                    "the program's address {p:#x} of a global ({b} bytes) that the target's \
                     driver put elsewhere is in use there"
                )));
            }
        }
        placed.hold(&ranges)
    }

    /// Makes `rebuilt` (made from `image`) the session's, and lets the old
    /// context go with everything in it.
    fn adopt(&mut self, rebuilt: Rebuilt, image: SessionImage) {
        let Rebuilt {
            device,
            ctx,
            order,
            gate,
            mut loaded,
            moved,
            aliases,
            early_mapping,
            ..
        } = rebuilt;
        self.aliases = aliases;
        // The old stream order first: nothing is queued, its threads end.
        if let Some(old) = self.gate.take() {
            old.cancel_queued();
            old.forget_in_flight();
        }
        if let Some(old) = self.threads.take() {
            old.cancel_queued();
            drop(old);
        }
        let old = OldContext {
            ctx: std::mem::replace(&mut self.ctx, ctx),
            modules: self.modules.drain().map(|(_, m)| m.id).collect(),
            memory: self.allocations.iter().map(|(&p, &s)| (p, s)).collect(),
            session: self.id(),
            early_mapping,
        };
        // Released on a thread of its own, no part of the program's pause;
        // where no thread can be had, here (the closure drops it).
        let _ = std::thread::Builder::new()
            .name("cumux-move-old".into())
            .spawn(move || drop(old));
        self.threads = order.threads;
        self.signals = order.signals;
        self.watched = order.watched;
        self.signal_wait = order.signal_wait;
        self.worker_errors_seen.set(0);
        self.gate = gate;
        self.sched_streams = SchedStreams::default();
        self.limits = cumux_protocol::launch_checks::LaunchLimits::of(&device.info().attributes);
        self.device = device;
        if let Some(group) = &self.group {
            group.add_member(self.index, &self.ctx);
        }
        self.set_cancel_target();
        // The tables, as the image says.
        self.allocations = image
            .allocations
            .iter()
            .map(|a| (a.ptr, a.size))
            .collect::<BTreeMap<_, _>>();
        self.globals.clear();
        self.functions.clear();
        self.module_bytes.clear();
        for m in image.modules {
            let Some(module) = loaded.remove(&m.handle) else {
                continue;
            };
            for g in &module.globals {
                if g.size > 0 {
                    self.globals.insert(g.ptr, g.size);
                }
            }
            for ((index, desc), &handle) in module.kernels.into_iter().enumerate().zip(&m.functions)
            {
                let entry = FunctionEntry {
                    module: module.id,
                    index,
                    desc,
                };
                self.functions.insert(handle, entry);
            }
            if m.charged > 0 {
                self.module_bytes.insert(m.handle, m.charged);
            }
            let entry = ModuleEntry {
                id: module.id,
                functions: m.functions,
                globals: module.globals.iter().map(|g| g.ptr).collect(),
                image: m.image,
            };
            self.modules.insert(m.handle, entry);
        }
        let module_ids: HashMap<Handle, u64> =
            self.modules.iter().map(|(h, m)| (*h, m.id)).collect();
        self.graphs = image
            .graphs
            .into_iter()
            .map(|g| {
                let launches = g
                    .launches
                    .into_iter()
                    .filter_map(|l| {
                        let mut params = l.params;
                        moved.params(&mut params);
                        Some(KernelLaunch {
                            module: *module_ids.get(&l.module)?,
                            kernel: usize::try_from(l.kernel).ok()?,
                            geometry: l.geometry,
                            params,
                        })
                    })
                    .collect();
                (g.handle, launches)
            })
            .collect();
        self.streams = image
            .streams
            .iter()
            .map(|s| (s.handle, (s.flags, s.priority)))
            .collect();
        self.events = image.events.into_iter().collect();
        self.next_handle = image.next_handle;
        let stats = &self.core.stats;
        let used = self.allocations.values().sum::<u64>();
        stats
            .mem_used
            .store(used, std::sync::atomic::Ordering::Relaxed);
        let count = self.allocations.len() as u64;
        stats
            .allocations
            .store(count, std::sync::atomic::Ordering::Relaxed);
        self.queued_since_sync.set(false);
        self.enqueue_failed.set(false);
        self.reregister();
    }
}

/// The launch `l` names, on the modules loaded again, its parameters'
/// addresses of `moved` globals turned into their new ones.
fn launch_of(
    loaded: &HashMap<Handle, LoadedModule>,
    l: &LaunchImage,
    moved: &Aliases,
) -> Result<KernelLaunch, CuError> {
    let module = loaded.get(&l.module).ok_or_else(|| {
        err(
            codes::INVALID_IMAGE,
            format!("a graph names module {}", l.module),
        )
    })?;
    let kernel = usize::try_from(l.kernel)
        .ok()
        .filter(|k| *k < module.kernels.len())
        .ok_or_else(|| {
            err(
                codes::INVALID_IMAGE,
                "a graph names a kernel its module lacks",
            )
        })?;
    let mut params = l.params.clone();
    moved.params(&mut params);
    Ok(KernelLaunch {
        module: module.id,
        kernel,
        geometry: l.geometry.clone(),
        params,
    })
}

/// An image whose handles repeat, or lie at or past its next handle (but a
/// stream's or an event's the client chose in its minted range), is refused.
fn check_handles(image: &SessionImage) -> Result<(), CuError> {
    let first = cumux_protocol::first_handle(image.index);
    if cumux_protocol::device_of_handle(image.next_handle) != image.index {
        return Err(err(
            codes::INVALID_VALUE,
            format!(
                "the image's next handle {:#x} is another device's",
                image.next_handle
            ),
        ));
    }
    let mut seen = HashSet::new();
    let issued = image
        .modules
        .iter()
        .flat_map(|m| std::iter::once(m.handle).chain(m.functions.iter().copied()))
        .chain(image.graphs.iter().map(|g| g.handle))
        .map(|h| (h, false));
    let nameable = image
        .streams
        .iter()
        .map(|s| s.handle)
        .chain(image.events.iter().map(|e| e.0))
        .map(|h| (h, true));
    for (handle, may_be_minted) in issued.chain(nameable) {
        let minted = may_be_minted && cumux_protocol::is_minted(image.index, handle);
        let in_place = minted || (handle >= first && handle < image.next_handle);
        if !in_place || !seen.insert(handle) {
            return Err(err(
                codes::INVALID_VALUE,
                format!("the image's handle {handle} is out of place"),
            ));
        }
    }
    Ok(())
}
