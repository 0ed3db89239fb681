//! Host functions on streams (`cuLaunchHostFunc`, `cuStreamAddCallback`), run
//! in the program's own process in stream order. Each stream has a gate: a
//! host function records an event on the stream and joins the stream's queue;
//! one worker thread per busy stream waits (polling the event) until the
//! stream reaches it, then calls it. Until the queue is empty, new work for
//! that stream waits at the gate, so it starts after the callback, and
//! synchronising the stream includes its callbacks.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use cumux_protocol::{Call, Handle, ReplyBody};

use crate::errors::*;
use crate::state::Client;

/// A pending host function: what to call once the stream reaches `event`.
pub struct HostCall {
    pub event: Handle,
    pub run: Box<dyn FnOnce(CUresult) + Send>,
}

#[derive(Default)]
struct Queue {
    calls: VecDeque<HostCall>,
    /// Calls queued or running; work for the stream waits while non-zero.
    pending: usize,
    worker: bool,
}

#[derive(Default)]
pub struct Gate {
    queue: Mutex<Queue>,
    idle: Condvar,
}

fn lock(q: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    q.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gate {
    /// Blocks until every host function queued on the stream has run.
    pub fn wait_idle(&self) {
        let mut q = lock(&self.queue);
        while q.pending > 0 {
            q = self.idle.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub fn busy(&self) -> bool {
        lock(&self.queue).pending > 0
    }
}

/// Gates by server stream handle.
#[derive(Default)]
pub struct Gates(Mutex<HashMap<Handle, Arc<Gate>>>);

impl Gates {
    pub fn get(&self, stream: Handle) -> Arc<Gate> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(map.entry(stream).or_default())
    }

    pub fn all(&self) -> Vec<Arc<Gate>> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.values().cloned().collect()
    }
}

/// Queues `run` to be called once `stream` has finished the work queued so far.
pub fn enqueue(
    client: &'static Client,
    stream: Handle,
    run: Box<dyn FnOnce(CUresult) + Send>,
) -> CuResult<()> {
    let event = match client.call(Call::EventCreate { flags: 0x2 })? {
        ReplyBody::Handle(h) => h,
        _ => return Err(CUDA_ERROR_UNKNOWN),
    };
    client.call(Call::EventRecord { event, stream })?;
    let gate = client.gates.get(stream);
    let mut q = lock(&gate.queue);
    q.calls.push_back(HostCall { event, run });
    q.pending += 1;
    if !q.worker {
        q.worker = true;
        let gate = Arc::clone(&gate);
        std::thread::Builder::new()
            .name("cumux-host-fn".into())
            .spawn(move || worker(client, gate))
            .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    }
    Ok(())
}

/// Waits for the stream to reach one event: polls, backing off to 2 ms.
fn reached(client: &Client, event: Handle) -> CUresult {
    let mut pause = Duration::from_micros(20);
    loop {
        match client.call(Call::EventQuery { event }) {
            Ok(_) => return CUDA_SUCCESS,
            Err(CUDA_ERROR_NOT_READY) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(2));
            }
            Err(e) => return e,
        }
    }
}

fn worker(client: &'static Client, gate: Arc<Gate>) {
    loop {
        let next = {
            let mut q = lock(&gate.queue);
            match q.calls.pop_front() {
                Some(c) => c,
                None => {
                    q.worker = false;
                    return;
                }
            }
        };
        let status = reached(client, next.event);
        let _ = client.call(Call::EventDestroy { event: next.event });
        // A panicking host function must not take the worker (and the gate) down.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (next.run)(status)));
        let mut q = lock(&gate.queue);
        q.pending -= 1;
        if q.pending == 0 {
            gate.idle.notify_all();
        }
    }
}

/// A raw pointer the program handed over, moved to the worker thread.
#[derive(Clone, Copy)]
pub struct UserData(pub *mut c_void);
// SAFETY: the driver API hands the pointer to the callback on another thread,
// as NVIDIA's driver does; the program owns what it points to.
unsafe impl Send for UserData {}
// SAFETY: as above; a recorded host function may be replayed from any thread.
unsafe impl Sync for UserData {}
