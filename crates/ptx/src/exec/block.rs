//! One block on one host worker: its threads run warp by warp up to their
//! next collective, which is resolved as soon as its participants arrived;
//! a block whose threads can never all proceed fails as a deadlock.

use super::barrier::resolve_barriers;
use super::state::{Block, Geo, Status, Thread};
use super::thread::run_thread;
use super::warp::{resolve_warp, resolve_warps};
use crate::launch::Fault;

/// State of the block's threads plus the per-worker scratch.
pub(super) struct Worker {
    pub threads: Vec<Thread>,
    pub block: Block,
}

impl Worker {
    pub(super) fn new(smid: u32) -> Worker {
        Worker {
            threads: Vec::new(),
            block: Block::new(smid),
        }
    }

    /// Runs block `block_id` of the grid to its end.
    pub(super) fn run_block(&mut self, g: &Geo<'_>, block_id: u64) -> Result<(), Fault> {
        let [gx, gy, _] = g.config.grid;
        let ctaid = [
            (block_id % gx as u64) as u32,
            ((block_id / gx as u64) % gy as u64) as u32,
            (block_id / (gx as u64 * gy as u64)) as u32,
        ];
        let n = g.config.block.iter().product::<u32>() as usize;
        let kf = &g.prog.funcs[g.kernel as usize];
        let b = &mut self.block;
        b.ctaid = ctaid;
        b.arrivals = [0; 16];
        b.warp_live.clear();
        for w in 0..n.div_ceil(32) {
            let lanes = (n - w * 32).min(32);
            b.warp_live.push(if lanes == 32 {
                u32::MAX
            } else {
                (1u32 << lanes) - 1
            });
        }
        let words = (g.shared_bytes as usize).div_ceil(8);
        b.shared.clear();
        b.shared.resize(words, 0);
        self.threads.truncate(n);
        self.threads.resize_with(n, Thread::new);
        for th in self.threads.iter_mut() {
            th.reset(g.kernel, kf.nregs, kf.frame_bytes);
        }
        loop {
            // run warp by warp, resolving that warp's collectives as soon as
            // all of its lanes are blocked
            for w in 0..n.div_ceil(32) {
                let lanes = w * 32..(w * 32 + 32).min(n);
                loop {
                    if g.lockstep {
                        // warp-synchronous code: lanes advance one instruction at a time
                        loop {
                            let mut ran = false;
                            for lin in lanes.clone() {
                                let th = &mut self.threads[lin];
                                if th.status == Status::Ready {
                                    ran = true;
                                    run_thread::<true>(g, &mut self.block, th, lin as u32)?;
                                }
                            }
                            if !ran {
                                break;
                            }
                        }
                    } else {
                        for lin in lanes.clone() {
                            let th = &mut self.threads[lin];
                            if th.status == Status::Ready {
                                run_thread::<false>(g, &mut self.block, th, lin as u32)?;
                            }
                        }
                    }
                    if !resolve_warp(g, &mut self.threads, &mut self.block, w, false)? {
                        break;
                    }
                }
            }
            if self.threads.iter().all(|t| t.status == Status::Exited) {
                return Ok(());
            }
            // a thread that yielded in a long loop runs again next round
            let yielded = self.threads.iter().any(|t| t.status == Status::Ready);
            let progressed = resolve_barriers(g, &mut self.threads, &mut self.block)
                || resolve_warps(g, &mut self.threads, &mut self.block, true)?
                || yielded;
            if !progressed {
                return Err(self.deadlock(g, ctaid));
            }
        }
    }

    /// The fault of a block none of whose waiting threads can proceed.
    fn deadlock(&self, g: &Geo<'_>, ctaid: [u32; 3]) -> Fault {
        let waiting: Vec<usize> = self
            .threads
            .iter()
            .enumerate()
            .filter(|(_, t)| t.status != Status::Exited)
            .map(|(i, _)| i)
            .take(8)
            .collect();
        let line = waiting
            .first()
            .and_then(|&i| {
                let t = &self.threads[i];
                g.prog
                    .funcs
                    .get(t.func as usize)?
                    .code
                    .get(t.pc as usize)
                    .map(|x| x.line)
            })
            .unwrap_or(0);
        Fault::Failed(format!(
            "deadlock in block {ctaid:?}: threads {waiting:?} wait at a barrier or warp op (line {line}) that can never complete"
        ))
    }
}
