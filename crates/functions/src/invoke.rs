//! One invocation, run on its tenant's lane: buffers taken from the lane's
//! pool (inputs copied in whole, every other byte zero, so no kernel reads
//! another invocation's data), the plan's steps issued as the session's own
//! calls on the default stream (calls of other functions on the same
//! buffers), the outputs read back once the work is done, and every buffer
//! scrubbed and given back whatever happened (once the answer is out).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::{Call, ModuleInfo, ReplyBody, DEFAULT_STREAM};

use crate::failure::Failure;
use crate::lane::{device, Buffer, LaneState};
use crate::plan::eval::Env;
use crate::plan::expr::Value;
use crate::plan::link::{check_geometry, MAX_CALL_DEPTH};
use crate::plan::validate::Step;
use crate::plan::validate::{Call as PlanCall, MAX_REPEAT};
use crate::plan::{BufferKind, Plan};
use crate::tensors::Tensor;

/// Most launches one invocation may issue, loops and calls included.
pub const MAX_LAUNCHES: u64 = 1 << 20;
/// Most steps (launches, loop turns, calls) one invocation may take.
pub const MAX_STEPS_RUN: u64 = 1 << 22;

/// What an invocation runs, with what.
pub struct Invocation {
    pub function: String,
    pub plan: Arc<Plan>,
    /// The plans of every function it calls, directly or not, by name.
    pub callees: HashMap<String, Arc<Plan>>,
    /// The module (registration version and image) of it and of every
    /// function it calls, by name.
    pub modules: HashMap<String, (u64, Arc<Vec<u8>>)>,
    pub inputs: BTreeMap<String, Tensor>,
    /// The invoked function's sizes and shapes ([`prepare`]).
    pub env: Env,
    pub deadline: Instant,
}

/// A function being run: its plan, names' values, buffers' addresses, module.
struct Frame<'a> {
    /// What places in this plan start with: empty for the invoked function,
    /// `launches[1] → "inner": ` for a function it calls.
    prefix: String,
    plan: &'a Plan,
    env: Env,
    addresses: Vec<u64>,
    module: ModuleInfo,
}

struct Runner<'a> {
    state: &'a mut LaneState,
    inv: &'a Invocation,
    /// Buffers taken from the lane's pool.
    allocated: Vec<Buffer>,
    launches: u64,
    /// Steps taken so far (see [`MAX_STEPS_RUN`]).
    steps_run: u64,
}

impl Runner<'_> {
    /// One call on the lane's session; `during` says what it was for, made
    /// only if it fails.
    fn call(&mut self, during: impl FnOnce() -> String, call: Call) -> Result<ReplyBody, Failure> {
        self.state.call(call).map_err(|e| device(during(), e))
    }

    /// A buffer of size class `class` from the lane's pool, given back once
    /// the invocation has answered; whether it is known to be all zeros.
    fn take(&mut self, path: &str, bytes: u64) -> Result<Buffer, Failure> {
        let class = LaneState::size_class(bytes);
        let buffer = self
            .state
            .take_buffer(class)
            .map_err(|e| device(format!("{path}: allocating {bytes} bytes"), e))?;
        self.allocated.push(buffer);
        Ok(buffer)
    }

    /// Zeroes `buffer` from byte `from` on, unless it is known to be zeros.
    fn zero_from(&mut self, path: &str, buffer: Buffer, from: u64) -> Result<(), Failure> {
        let rest = buffer.class.saturating_sub(from);
        if rest == 0 || buffer.zeroed {
            return Ok(());
        }
        let call = Call::Memset {
            dst: buffer.ptr + from,
            value: 0,
            elem_bytes: 1,
            count: rest,
            pitch: rest,
            height: 1,
            stream: Some(DEFAULT_STREAM),
        };
        self.call(|| format!("{path}: zeroing"), call)?;
        Ok(())
    }

    /// A buffer of `bytes` from the lane's pool, all zeros before any kernel
    /// runs (a pooled buffer was zeroed on its way back; a new one is zeroed
    /// here): a callee's own scratch.
    fn buffer(&mut self, path: &str, bytes: u64) -> Result<u64, Failure> {
        let buffer = self.take(path, bytes)?;
        self.zero_from(path, buffer, 0)?;
        Ok(buffer.ptr)
    }

    /// Copies `region` (its pieces at their offsets, zeros between them) to
    /// `dst` on the default stream, in chunks of at most a frame's bytes.
    fn copy_in(&mut self, dst: u64, region: &Region<'_>) -> Result<(), Failure> {
        let mut at = 0;
        while at < region.len {
            let n = (region.len - at).min(MAX_CHUNK_BYTES as u64);
            let call = Call::MemcpyHtoD {
                dst: dst + at,
                data: region.bytes(at, n),
                stream: Some(DEFAULT_STREAM),
            };
            self.call(|| "inputs: copying them in".to_string(), call)?;
            at += n;
        }
        Ok(())
    }

    fn read(&mut self, path: &str, ptr: u64, bytes: u64) -> Result<Vec<u8>, Failure> {
        let mut out = Vec::with_capacity(bytes as usize);
        while (out.len() as u64) < bytes {
            let n = (bytes - out.len() as u64).min(MAX_CHUNK_BYTES as u64);
            let call = Call::MemcpyDtoH {
                src: ptr + out.len() as u64,
                bytes: n,
                stream: None,
            };
            match self.call(|| format!("{path}: copying the output out"), call)? {
                ReplyBody::Data(d) => out.extend(d),
                other => return Err(Failure::Internal(format!("a copy answered {other:?}"))),
            }
        }
        Ok(out)
    }

    fn steps(&mut self, frame: &Frame<'_>, steps: &[Step], depth: usize) -> Result<(), Failure> {
        for step in steps {
            if Instant::now() >= self.inv.deadline {
                return Err(Failure::Deadline(
                    "the invocation ran past its deadline".into(),
                ));
            }
            self.steps_run += 1;
            if self.steps_run > MAX_STEPS_RUN {
                return Err(Failure::BadRequest(at_function(
                    frame,
                    format!("more than {MAX_STEPS_RUN} steps in one invocation"),
                )));
            }
            match step {
                Step::Launch(launch) => {
                    self.launches += 1;
                    if self.launches > MAX_LAUNCHES {
                        return Err(Failure::BadRequest(format!(
                            "{}: more than {MAX_LAUNCHES} launches in one invocation",
                            launch.path
                        )));
                    }
                    let at = |e: String| Failure::BadRequest(at_function(frame, e));
                    let kernel = frame
                        .module
                        .functions
                        .iter()
                        .find(|k| k.name == launch.kernel)
                        .ok_or_else(|| {
                            at(format!(
                                "{}.kernel: no kernel {:?}",
                                launch.path, launch.kernel
                            ))
                        })?;
                    let (grid, block, shared) = frame.env.shape(launch).map_err(at)?;
                    check_geometry(launch, grid, block, shared, kernel, &self.state.limits)
                        .map_err(at)?;
                    let params = frame
                        .env
                        .pack(launch, &frame.addresses, kernel)
                        .map_err(at)?;
                    let call = Call::Launch {
                        function: kernel.handle,
                        grid: grid.map(|d| d as u32),
                        block: block.map(|d| d as u32),
                        shared_bytes: shared as u32,
                        stream: DEFAULT_STREAM,
                        params,
                        attributes: Vec::new(),
                    };
                    let during = || {
                        at_function(
                            frame,
                            format!("{} (kernel {:?})", launch.path, launch.kernel),
                        )
                    };
                    self.call(during, call)?;
                }
                Step::Loop { path, times, steps } => {
                    let n = frame
                        .env
                        .count(&format!("{path}.repeat"), times, 0, MAX_REPEAT)
                        .map_err(|e| Failure::BadRequest(at_function(frame, e)))?;
                    for _ in 0..n {
                        self.steps(frame, steps, depth)?;
                    }
                }
                Step::Call(call) => self.call_function(frame, call, depth + 1)?,
            }
        }
        Ok(())
    }

    fn call_function(
        &mut self,
        caller: &Frame<'_>,
        call: &PlanCall,
        depth: usize,
    ) -> Result<(), Failure> {
        let path = &call.path;
        let bad = |e: String| Failure::BadRequest(at_function(caller, format!("{path}: {e}")));
        if depth > MAX_CALL_DEPTH {
            return Err(bad(format!("calls nest more than {MAX_CALL_DEPTH} deep")));
        }
        let plan = self
            .inv
            .callees
            .get(&call.function)
            .ok_or_else(|| bad(format!("function {:?} is gone", call.function)))?;
        let mut inputs = BTreeMap::new();
        for (_, b) in plan.of_kind(BufferKind::Input) {
            let (_, ours) = call
                .bind
                .iter()
                .find(|(n, _)| n == &b.name)
                .ok_or_else(|| {
                    bad(format!(
                        "input {:?} of {:?} is not bound",
                        b.name, call.function
                    ))
                })?;
            inputs.insert(b.name.clone(), caller.env.shapes[*ours].clone());
        }
        let mut params = BTreeMap::new();
        for (name, e) in &call.params {
            let value = caller
                .env
                .eval(&format!("{path}.params.{name}"), e)
                .map_err(|e| Failure::BadRequest(at_function(caller, e)))?;
            params.insert(name.clone(), value);
        }
        let env = Env::new(plan, &inputs, &params)
            .map_err(|e| bad(format!("in {:?}: {e}", call.function)))?;
        let mut addresses = vec![0u64; plan.buffers.len()];
        for (i, b) in plan.buffers.iter().enumerate() {
            match call.bind.iter().find(|(n, _)| n == &b.name) {
                Some((_, ours)) => {
                    if env.elements[i] > caller.env.elements[*ours] {
                        return Err(bad(format!(
                            "{:?} sizes {:?} at {} elements, buffer {:?} has {}",
                            call.function,
                            b.name,
                            env.elements[i],
                            caller.plan.buffers[*ours].name,
                            caller.env.elements[*ours]
                        )));
                    }
                    addresses[i] = caller.addresses[*ours];
                }
                None => {
                    let bytes = byte_size(env.elements[i], b.dtype.size())
                        .map_err(|e| bad(format!("{}: {e}", b.path)))?;
                    addresses[i] = self.buffer(&format!("{path} {}", b.path), bytes)?;
                }
            }
        }
        let module = module_of(self.state, self.inv, &call.function)?;
        let frame = Frame {
            prefix: format!("{}{path} → {:?}: ", caller.prefix, call.function),
            plan,
            env,
            addresses,
            module,
        };
        self.steps(&frame, &plan.steps, depth)
    }
}

/// The module of function `name` of the invocation, loaded in the lane.
fn module_of(state: &mut LaneState, inv: &Invocation, name: &str) -> Result<ModuleInfo, Failure> {
    let (version, image) = inv
        .modules
        .get(name)
        .ok_or_else(|| Failure::NotFound(format!("function {name:?} is gone")))?;
    state.module(name, *version, image)
}

fn at_function(frame: &Frame<'_>, text: String) -> String {
    format!("{}{text}", frame.prefix)
}

fn byte_size(elements: u64, size: u64) -> Result<u64, String> {
    elements
        .checked_mul(size)
        .ok_or_else(|| format!("{elements} elements of {size} bytes overflow"))
}

/// What `plan` makes of `inputs` and `params`: every buffer's size and
/// shape, or why the inputs do not fit it (a dtype, a size or a shape other
/// than the plan says, naming the input): checked before the invocation is
/// queued.
pub fn prepare(
    plan: &Plan,
    inputs: &BTreeMap<String, Tensor>,
    params: &BTreeMap<String, Value>,
) -> Result<Env, Failure> {
    for (_, b) in plan.of_kind(BufferKind::Input) {
        if let Some(t) = inputs.get(&b.name) {
            if t.dtype != b.dtype {
                return Err(Failure::BadRequest(format!(
                    "inputs.{}: dtype {}, the function takes {}",
                    b.name,
                    t.dtype.name(),
                    b.dtype.name()
                )));
            }
        }
    }
    let shapes: BTreeMap<String, Vec<u64>> = inputs
        .iter()
        .map(|(n, t)| (n.clone(), t.shape.clone()))
        .collect();
    Env::new(plan, &shapes, params).map_err(Failure::BadRequest)
}

/// Runs `inv` on the lane: its outputs by name.
pub fn run(state: &mut LaneState, inv: &Invocation) -> Result<BTreeMap<String, Tensor>, Failure> {
    let env = inv.env.clone();
    let module = module_of(state, inv, &inv.function)?;
    let mut runner = Runner {
        state,
        inv,
        allocated: Vec::new(),
        launches: 0,
        steps_run: 0,
    };
    let result = run_in(&mut runner, env, module);
    if result.is_err() {
        // Work queued before the failure ends now, and its errors with it:
        // none may surface in the next invocation.
        let _ = runner.state.call(Call::ContextSynchronize);
        if matches!(result, Err(Failure::Device { .. })) {
            // A failed scrub may be what failed (see `LaneState::give_back`):
            // no pooled buffer is trusted to be zero any more.
            runner.state.drain_pool();
        }
    }
    for buffer in std::mem::take(&mut runner.allocated) {
        runner.state.give_back_later(buffer);
    }
    result
}

/// Where each buffer of a plan lies in the invocation's one allocation:
/// inputs first, then outputs, then scratch (the plan's order), each at a
/// multiple of [`ALIGN`] bytes, so that the inputs go in by one copy, the
/// outputs come out by one read, and one scrub clears them all.
struct Layout {
    /// Each buffer's offset and bytes, in [`Plan::buffers`] order.
    spans: Vec<(u64, u64)>,
    /// Bytes of the whole.
    bytes: u64,
}

/// Where each buffer of an invocation's allocation starts: a multiple of this
/// (as the driver aligns its own allocations).
pub const ALIGN: u64 = 256;

impl Layout {
    fn of(plan: &Plan, env: &Env) -> Result<Layout, Failure> {
        let mut spans = Vec::with_capacity(plan.buffers.len());
        let mut end = 0u64;
        for (i, b) in plan.buffers.iter().enumerate() {
            let bytes = byte_size(env.elements[i], b.dtype.size())
                .map_err(|e| Failure::BadRequest(format!("{}: {e}", b.path)))?;
            spans.push((end, bytes));
            end = end
                .checked_add(bytes)
                .and_then(|e| e.checked_next_multiple_of(ALIGN))
                .ok_or_else(|| Failure::BadRequest(format!("{}: too large", b.path)))?;
        }
        Ok(Layout { spans, bytes: end })
    }

    /// The bytes from the first buffer of `kind` to the end of its last.
    fn extent(&self, plan: &Plan, kind: BufferKind) -> (u64, u64) {
        let mut of_kind = plan.of_kind(kind).map(|(i, _)| self.spans[i]);
        match of_kind.next() {
            None => (0, 0),
            Some((start, bytes)) => {
                let end = of_kind.last().map_or(start + bytes, |(o, b)| o + b);
                (start, end - start)
            }
        }
    }
}

/// Bytes to copy in: pieces at their offsets, zeros between them.
struct Region<'a> {
    pieces: Vec<(u64, &'a [u8])>,
    len: u64,
}

impl Region<'_> {
    /// The region's `n` bytes from `at`.
    /// Pieces in order of their offsets (as a [`Layout`] places them) are
    /// written once, with the zeros between them; any other order is laid
    /// over zeros.
    fn bytes(&self, at: u64, n: u64) -> Vec<u8> {
        let ordered = self
            .pieces
            .windows(2)
            .all(|w| w[0].0 + w[0].1.len() as u64 <= w[1].0);
        let mut out = match ordered {
            true => Vec::with_capacity(n as usize),
            false => vec![0u8; n as usize],
        };
        for (offset, data) in &self.pieces {
            let (start, end) = (*offset, offset + data.len() as u64);
            let (from, to) = (start.max(at), end.min(at + n));
            if from < to {
                let (lo, hi) = ((from - at) as usize, (to - at) as usize);
                let piece = &data[(from - start) as usize..(to - start) as usize];
                match ordered {
                    true => {
                        out.resize(lo, 0);
                        out.extend_from_slice(piece);
                    }
                    false => out[lo..hi].copy_from_slice(piece),
                }
            }
        }
        out.resize(n as usize, 0);
        out
    }
}

fn run_in(
    runner: &mut Runner<'_>,
    env: Env,
    module: ModuleInfo,
) -> Result<BTreeMap<String, Tensor>, Failure> {
    let inv = runner.inv;
    let plan = &inv.plan;
    let layout = Layout::of(plan, &env)?;
    let whole = runner.take("buffers", layout.bytes)?;
    let (_, inputs_len) = layout.extent(plan, BufferKind::Input);
    let pieces = plan
        .of_kind(BufferKind::Input)
        .filter_map(|(i, b)| Some((layout.spans[i].0, inv.inputs.get(&b.name)?.data.as_slice())))
        .collect();
    let inputs = Region {
        pieces,
        len: inputs_len,
    };
    runner.copy_in(whole.ptr, &inputs)?;
    runner.zero_from("buffers", whole, inputs_len)?;
    let addresses = layout.spans.iter().map(|(o, _)| whole.ptr + o).collect();
    let frame = Frame {
        prefix: String::new(),
        plan,
        env,
        addresses,
        module,
    };
    hop_trace::mark(Hop::Step, "fn-inputs-in");
    runner.steps(&frame, &plan.steps, 0)?;
    hop_trace::mark(Hop::Step, "fn-launched");
    // One read of every output; it waits for the plan's work on the default
    // stream and reports its failure, as a synchronize would: one round trip
    // to the device fewer.
    let function = || format!("function {:?}", inv.function);
    let (start, bytes) = layout.extent(plan, BufferKind::Output);
    let all = match bytes {
        0 => {
            runner.call(function, Call::ContextSynchronize)?;
            Vec::new()
        }
        _ => match runner.read("outputs", whole.ptr + start, bytes) {
            // The plan's own failure, found by the read that waited for it.
            Err(Failure::Device { error, .. }) => {
                return Err(Failure::Device {
                    during: function(),
                    error,
                })
            }
            read => read?,
        },
    };
    let mut outputs = BTreeMap::new();
    // A lone output is the read itself, not a copy of it.
    let (mut lone, all) = match plan.of_kind(BufferKind::Output).count() {
        1 => (Some(all), Vec::new()),
        _ => (None, all),
    };
    for (i, b) in plan.of_kind(BufferKind::Output) {
        let (offset, bytes) = layout.spans[i];
        let from = (offset - start) as usize;
        let short = || Failure::Internal(format!("{}: a short read", b.path));
        let data = match lone.take() {
            Some(mut read) => {
                if read.len() < from + bytes as usize {
                    return Err(short());
                }
                read.truncate(from + bytes as usize);
                read.drain(..from);
                read
            }
            None => all
                .get(from..from + bytes as usize)
                .ok_or_else(short)?
                .to_vec(),
        };
        outputs.insert(
            b.name.clone(),
            Tensor {
                dtype: b.dtype,
                shape: frame.env.shapes[i].clone(),
                data,
            },
        );
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::Region;

    #[test]
    fn a_region_has_its_pieces_at_their_offsets_and_zeros_between_in_any_order() {
        let (a, b) = ([1u8, 2, 3], [4u8, 5]);
        let want = [0, 1, 2, 3, 0, 0, 4, 5, 0, 0];
        for pieces in [
            vec![(1, &a[..]), (6, &b[..])],
            vec![(6, &b[..]), (1, &a[..])],
        ] {
            let region = Region { pieces, len: 10 };
            assert_eq!(region.bytes(0, 10), want);
            for at in 0..10 {
                for n in 0..=10 - at {
                    let (lo, hi) = (at as usize, (at + n) as usize);
                    assert_eq!(region.bytes(at, n), want[lo..hi], "{at} + {n}");
                }
            }
        }
    }
}
