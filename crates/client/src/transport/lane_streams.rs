//! A session's lanes on the client: further TCP (or TLS) connections that
//! carry large copies' frames or answers beside the first, each on its own thread.

use std::io::Read;
use std::thread::{JoinHandle, ScopedJoinHandle};

use cumux_protocol::stream::Stream;
use cumux_protocol::{
    self as proto, ClientRole, Hello, HelloReply, LaneJoin, LaneOffer, Reply, ReplyBody,
};

/// Lanes a session opens where the environment does not say
/// (`CUMUX_LANES`; 0: none). Each is one more TLS stream's worth of bandwidth.
pub(super) const DEFAULT_LANES: u32 = 4;

/// The environment variable that sets how many lanes a session opens.
pub(super) const LANES_ENV: &str = "CUMUX_LANES";

/// A copy goes on lanes from this many chunks on.
pub(super) const LANE_CHUNKS: usize = 2;

/// How many lanes a session asks for, within what the server offers.
pub(super) fn wanted(offer: &LaneOffer) -> u32 {
    let asked = match std::env::var(LANES_ENV) {
        Ok(text) => text.trim().parse::<u32>().unwrap_or_else(|_| {
            tracing::warn!("{LANES_ENV}={text:?} is not a number of lanes; using {DEFAULT_LANES}");
            DEFAULT_LANES
        }),
        Err(_) => DEFAULT_LANES,
    };
    if asked > offer.most {
        tracing::warn!(
            "{LANES_ENV}={asked}: the server takes at most {} lanes; opening {}",
            offer.most,
            offer.most
        );
    }
    asked.min(offer.most)
}

/// The lanes of a connection: being opened, open, or none.
#[derive(Default)]
pub(super) enum LaneState {
    #[default]
    None,
    /// Opening on a thread since the welcome.
    Opening(JoinHandle<Lanes>),
    Open(Lanes),
}

impl LaneState {
    /// Starts opening `count` lanes of `session` at `address`.
    pub(super) fn open(
        address: &proto::address::ServerAddress,
        session: u64,
        offer: LaneOffer,
        count: u32,
    ) -> LaneState {
        if count == 0 {
            return LaneState::None;
        }
        let address = address.clone();
        let opening = std::thread::Builder::new()
            .name("cumux-lanes".into())
            .spawn(move || Lanes::open(&address, session, offer, count));
        match opening {
            Ok(thread) => LaneState::Opening(thread),
            Err(e) => {
                tracing::warn!("cannot open lanes: {e}");
                LaneState::None
            }
        }
    }

    /// The lanes, where they are open (never waiting for them).
    pub(super) fn ready(&mut self) -> Option<&mut Lanes> {
        if matches!(self, LaneState::Opening(thread) if thread.is_finished()) {
            let LaneState::Opening(thread) = std::mem::take(self) else {
                return None;
            };
            *self = match thread.join() {
                Ok(lanes) if !lanes.streams.is_empty() => LaneState::Open(lanes),
                _ => LaneState::None,
            };
        }
        match self {
            LaneState::Open(lanes) => Some(lanes),
            _ => None,
        }
    }

    /// Closes the lanes (the connection is lost or moves).
    pub(super) fn close(&mut self) {
        if let LaneState::Open(lanes) = std::mem::take(self) {
            lanes.streams.iter().for_each(Stream::shutdown);
        }
    }
}

/// Open lanes, in order: lane `i` is the server's lane `i`.
pub(super) struct Lanes {
    streams: Vec<Stream>,
}

/// A request's frame for a lane: the encoded request and its bytes.
pub(super) type Frame<'a> = (Vec<u8>, &'a [u8]);

impl Lanes {
    /// Opens `count` lanes at once; those before the first that fails.
    fn open(
        address: &proto::address::ServerAddress,
        session: u64,
        offer: LaneOffer,
        count: u32,
    ) -> Lanes {
        let opened: Vec<Result<Stream, String>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..count)
                .map(|index| {
                    let join = LaneJoin {
                        session,
                        key: offer.key,
                        index,
                    };
                    scope.spawn(move || join_lane(address, join))
                })
                .collect();
            joined(threads)
        });
        let mut streams = Vec::new();
        for (index, opened) in opened.into_iter().enumerate() {
            match opened {
                Ok(stream) if streams.len() == index => streams.push(stream),
                Ok(stream) => stream.shutdown(),
                Err(why) => tracing::warn!("lane {index} of the session: {why}"),
            }
        }
        tracing::debug!(lanes = streams.len(), "lanes open");
        Lanes { streams }
    }

    pub(super) fn count(&self) -> usize {
        self.streams.len()
    }

    /// Writes `frames` on the lanes in turn (frame `i` on lane `i % count`),
    /// the lanes at once.
    pub(super) fn send(&mut self, frames: &[Frame<'_>]) -> Result<(), String> {
        let count = self.streams.len();
        std::thread::scope(|scope| {
            let sending: Vec<_> = self
                .streams
                .iter_mut()
                .enumerate()
                .map(|(lane, stream)| {
                    scope.spawn(move || -> Result<(), String> {
                        for (msg, bulk) in frames.iter().skip(lane).step_by(count) {
                            proto::write_message(stream, msg, bulk)
                                .map_err(|e| format!("lane {lane}: {e}"))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            joined(sending).into_iter().collect()
        })
    }

    /// Reads the answers of calls `first`, `first + 1`, … on the lanes in
    /// turn, each one's data straight into its part of `into` (in order).
    /// The answers, their data taken out.
    pub(super) fn receive(
        &mut self,
        first: u64,
        into: Vec<&mut [u8]>,
    ) -> Result<Vec<Reply>, String> {
        let count = self.streams.len();
        let mut per_lane: Vec<Vec<(u64, &mut [u8])>> = (0..count).map(|_| Vec::new()).collect();
        for (i, out) in into.into_iter().enumerate() {
            per_lane[i % count].push((first + i as u64, out));
        }
        let answered: Vec<Result<Vec<Reply>, String>> = std::thread::scope(|scope| {
            let threads: Vec<_> = self
                .streams
                .iter_mut()
                .zip(per_lane)
                .enumerate()
                .map(|(lane, (stream, outs))| {
                    scope.spawn(move || {
                        let mut buf = Vec::new();
                        outs.into_iter()
                            .map(|(seq, out)| answer_into(stream, &mut buf, seq, out))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|why| format!("lane {lane}: {why}"))
                    })
                })
                .collect();
            joined(threads)
        });
        let mut lanes = answered
            .into_iter()
            .map(|replies| replies.map(Vec::into_iter))
            .collect::<Result<Vec<_>, _>>()?;
        // Back in call order: lane by lane in turn.
        let calls = lanes.iter().map(ExactSizeIterator::len).sum::<usize>();
        Ok((0..calls).filter_map(|i| lanes[i % count].next()).collect())
    }
}

/// What each lane's thread gave, in lane order (a panic as an error).
fn joined<T>(threads: Vec<ScopedJoinHandle<'_, Result<T, String>>>) -> Vec<Result<T, String>> {
    threads
        .into_iter()
        .map(|t| {
            t.join()
                .unwrap_or_else(|_| Err("a lane's thread panicked".into()))
        })
        .collect()
}

/// One lane's connection: its hello names the session and its key.
fn join_lane(address: &proto::address::ServerAddress, join: LaneJoin) -> Result<Stream, String> {
    let mut stream = Stream::connect(address).map_err(|e| format!("cannot connect: {e:?}"))?;
    let hello = Hello {
        magic: proto::MAGIC,
        version: proto::PROTOCOL_VERSION,
        pid: std::process::id(),
        role: ClientRole::Lane,
        program: String::new(),
        tenant: None,
        token: None,
        shm: false,
        visible_devices: None,
        join: None,
        resume: None,
        lane: Some(join),
    };
    let bytes = proto::encode(&hello).map_err(|e| e.to_string())?;
    proto::write_frame(&mut stream, &bytes).map_err(|e| format!("hello: {e}"))?;
    let mut buf = Vec::new();
    proto::read_frame(&mut stream, &mut buf).map_err(|e| format!("welcome: {e}"))?;
    match proto::decode::<HelloReply>(&buf).map_err(|e| format!("welcome: {e}"))? {
        HelloReply::Welcome { session, .. } if session == join.session => Ok(stream),
        HelloReply::Welcome { session, .. } => Err(format!(
            "welcomed into session {session}, not {}",
            join.session
        )),
        HelloReply::Rejected { reason, .. } => Err(format!("refused: {reason}")),
    }
}

/// Call `seq`'s answer on `stream`, its data read straight into `out`.
fn answer_into(
    stream: &mut Stream,
    buf: &mut Vec<u8>,
    seq: u64,
    out: &mut [u8],
) -> Result<Reply, String> {
    let bulk_len = proto::read_message(stream, buf).map_err(|e| e.to_string())?;
    let reply: Reply = proto::decode(buf).map_err(|e| format!("malformed reply: {e}"))?;
    if reply.seq != seq {
        return Err(format!("the answer of call {} came for {seq}", reply.seq));
    }
    match (bulk_len, &reply.result) {
        (None, Err(_)) => Ok(reply),
        (None, Ok(ReplyBody::Data(d))) if d.len() == out.len() => {
            out.copy_from_slice(d);
            let mut reply = reply;
            reply.result = Ok(ReplyBody::Data(Vec::new()));
            Ok(reply)
        }
        (Some(len), Ok(ReplyBody::Data(d))) if len == out.len() && d.is_empty() => {
            stream.read_exact(out).map_err(|e| e.to_string())?;
            Ok(reply)
        }
        (len, result) => Err(format!(
            "call {seq}'s answer is not its {} bytes: {len:?} bytes, {}",
            out.len(),
            match result {
                Ok(_) => "success",
                Err(_) => "an error",
            }
        )),
    }
}
