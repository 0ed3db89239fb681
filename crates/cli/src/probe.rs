//! A minimal protocol client for the CLI itself: connect to a server, shake
//! hands, make one call. Used by `cumux status` and by `cumux run` to check that
//! a server answers before starting the program.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use cumux_protocol::{
    decode, encode, read_frame, write_frame, Call, ClientRole, Hello, HelloReply, Reply, ReplyBody,
    Request, ServerStatus, MAGIC, PROTOCOL_VERSION,
};
use cumux_server::Address;

/// A handshaken connection to a server.
pub struct Connection {
    reader: BufReader<Box<dyn Read + Send>>,
    writer: Box<dyn Write + Send>,
    seq: u64,
    buf: Vec<u8>,
    pub session: u64,
    pub server: String,
}

/// Connects to `address` and introduces itself with `role`.
pub fn connect(address: &Address, role: ClientRole, program: &str) -> Result<Connection> {
    let timeout = Some(Duration::from_secs(30));
    let (reader, writer): (Box<dyn Read + Send>, Box<dyn Write + Send>) = match address {
        Address::Unix(path) => {
            let s = UnixStream::connect(path)
                .with_context(|| format!("no cumux server answers at {address}"))?;
            s.set_read_timeout(timeout)?;
            (Box::new(s.try_clone()?), Box::new(s))
        }
        Address::Tcp(hostport) => {
            let s = TcpStream::connect(hostport.as_str())
                .with_context(|| format!("no cumux server answers at {address}"))?;
            s.set_read_timeout(timeout)?;
            (Box::new(s.try_clone()?), Box::new(s))
        }
    };
    let mut conn = Connection {
        reader: BufReader::new(reader),
        writer,
        seq: 0,
        buf: Vec::new(),
        session: 0,
        server: String::new(),
    };
    let hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        pid: std::process::id(),
        role,
        program: program.to_string(),
        // A status shows this tenant's sessions to a client that may be it.
        tenant: std::env::var("CUMUX_TENANT").ok(),
        token: std::env::var("CUMUX_TOKEN").ok(),
        shm: false,
    };
    conn.send(&hello)?;
    match conn.receive::<HelloReply>()? {
        HelloReply::Welcome {
            server, session, ..
        } => {
            conn.server = server;
            conn.session = session;
            Ok(conn)
        }
        HelloReply::Rejected {
            server_version,
            reason,
        } => bail!("the server (protocol version {server_version}) refused us: {reason}"),
    }
}

impl Connection {
    fn send<T: serde::Serialize>(&mut self, msg: &T) -> Result<()> {
        let bytes = encode(msg).map_err(|e| anyhow!("encode: {e}"))?;
        write_frame(&mut self.writer, &bytes)?;
        self.writer.flush()?;
        Ok(())
    }

    fn receive<T: for<'a> serde::Deserialize<'a>>(&mut self) -> Result<T> {
        read_frame(&mut self.reader, &mut self.buf).context("the server closed the connection")?;
        decode(&self.buf).map_err(|e| anyhow!("undecodable answer from the server: {e}"))
    }

    /// Makes one replied call.
    pub fn call(&mut self, call: Call) -> Result<ReplyBody> {
        self.seq += 1;
        let seq = self.seq;
        self.send(&Request { seq, call })?;
        let reply: Reply = self.receive()?;
        if reply.seq != seq {
            bail!("reply for call {} while waiting for {seq}", reply.seq);
        }
        reply.result.map_err(|e| anyhow!("{e}"))
    }

    /// Asks for the server's status.
    pub fn status(&mut self) -> Result<ServerStatus> {
        match self.call(Call::ServerStatus)? {
            ReplyBody::Status(status) => Ok(status),
            other => bail!("unexpected answer to a status call: {other:?}"),
        }
    }
}
