//! Process-group bootstrap for one process per GPU, from torchrun-style
//! environment variables, over plain TCP (std::net).
//!
//! Rank 0 listens on every local address (IPv6 and IPv4) on the group's port
//! ([`GroupEnv::port`]). Every other rank connects to `MASTER_ADDR` (trying
//! every address the name resolves to, again and again until the deadline,
//! since rank 0 may start later) and sends a hello: magic, protocol version,
//! its rank, the world size, a hash of the plan and the identity of its GPU,
//! so that processes running different plans or sizes, or two ranks given
//! one GPU, fail at once instead of hanging in NCCL. Once every rank has said
//! hello, rank 0 answers each with the 128-byte NCCL unique id, or with the
//! reason it refuses the group (a missing rank makes every process fail at
//! the deadline, none waits inside NCCL). After the run every rank sends
//! its verdict on the same connection; rank 0 merges them and sends the
//! group's verdict back to each rank. That answer is also the barrier
//! before teardown: no rank closes its NCCL communicator before every rank
//! has finished its transfers.
//!
//! Messages (little endian):
//! - hello, 40 bytes: `"SWYD"`, version u8, 3 zero bytes, rank u32, world
//!   u32, plan hash u64, device key (16 bytes: the GPU's UUID);
//! - welcome: `"SWYD"`, status u8; status 0 is followed by the 128 id
//!   bytes, status 1 (refused) by a message (length u32, UTF-8);
//! - verdict (rank to rank 0, then the group's from rank 0 to every rank):
//!   bad bytes u64, first wrong iteration u32 (0: none), message length u32,
//!   UTF-8 message (empty when clean).

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::RuntimeError;

const MAGIC: &[u8; 4] = b"SWYD";
const VERSION: u8 = 2;
pub const HELLO_LEN: usize = 40;
pub const ID_LEN: usize = 128;
pub const KEY_LEN: usize = 16;
/// A welcome that carries the id.
pub const WELCOME_LEN: usize = 5 + ID_LEN;
/// Longest message a peer may send (a refusal or a first bad range).
const MAX_MESSAGE: usize = 1 << 16;

fn err(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Bootstrap(msg.into())
}

/// Where the group's port came from: error messages name the variable
/// to fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSource {
    /// `SWITCHYARD_PORT`.
    Switchyard,
    /// `MASTER_PORT`.
    Master,
    /// Next to `MASTER_PORT` (here its value), which torchrun's own store
    /// holds (`TORCHELASTIC_USE_AGENT_STORE=True`).
    NextToAgentStore(u16),
}

impl PortSource {
    /// How a message names the port.
    pub fn describe(self) -> String {
        match self {
            PortSource::Switchyard => "SWITCHYARD_PORT".into(),
            PortSource::Master => "MASTER_PORT".into(),
            PortSource::NextToAgentStore(m) => format!(
                "next to MASTER_PORT={m}, which torchrun's own store holds (TORCHELASTIC_USE_AGENT_STORE)"
            ),
        }
    }

    /// What to do when rank 0 cannot listen on the port.
    fn fix(self) -> &'static str {
        match self {
            PortSource::Switchyard => "set SWITCHYARD_PORT to a free port, the same on every rank",
            PortSource::Master | PortSource::NextToAgentStore(_) => {
                "if a launcher's store holds it, set SWITCHYARD_PORT to a free port, the same on every rank"
            }
        }
    }
}

/// This process's place in the group, from `RANK`, `WORLD_SIZE`,
/// `LOCAL_RANK`, `MASTER_ADDR` and the port: `SWITCHYARD_PORT` when set,
/// else `MASTER_PORT`, else, under torchrun with its agent store (which
/// already listens on `MASTER_PORT`), the port next to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupEnv {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub master_addr: String,
    /// The port rank 0 listens on.
    pub port: u16,
    pub port_source: PortSource,
}

/// A TCP port from variable `name`: 1 to 65535 (port 0 would make rank 0
/// listen where no other rank can find it).
fn parse_port(name: &str, v: &str) -> Result<u16, RuntimeError> {
    v.trim()
        .parse::<u16>()
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| err(format!("{name}=`{v}` is not a TCP port (1 to 65535)")))
}

/// torchrun writes `str(bool)`: `True` or `False`.
fn truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes")
}

/// The port used when torchrun's store holds `MASTER_PORT`: the next one,
/// the same on every rank.
pub fn port_next_to(master: u16) -> u16 {
    if master < u16::MAX {
        master + 1
    } else {
        master - 1
    }
}

impl GroupEnv {
    /// `None` when `WORLD_SIZE` is unset (a single process runs every rank).
    pub fn from_vars(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<GroupEnv>, RuntimeError> {
        let Some(world) = get("WORLD_SIZE") else {
            return Ok(None);
        };
        let num = |name: &str, v: Option<String>| -> Result<usize, RuntimeError> {
            let v = v.ok_or_else(|| err(format!("WORLD_SIZE is set but {name} is not")))?;
            v.trim()
                .parse()
                .map_err(|_| err(format!("{name}=`{v}` is not a non-negative integer")))
        };
        let world = num("WORLD_SIZE", Some(world))?;
        let rank = num("RANK", get("RANK"))?;
        let local_rank = match get("LOCAL_RANK") {
            Some(v) => num("LOCAL_RANK", Some(v))?,
            None => rank,
        };
        if world == 0 || rank >= world {
            return Err(err(format!("RANK={rank} is not below WORLD_SIZE={world}")));
        }
        let master_addr = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        // SWITCHYARD_PORT wins: a launcher's own store may already hold MASTER_PORT.
        let (port, port_source) = match get("SWITCHYARD_PORT") {
            Some(v) => (parse_port("SWITCHYARD_PORT", &v)?, PortSource::Switchyard),
            None => {
                let v = get("MASTER_PORT").ok_or_else(|| {
                    err("WORLD_SIZE is set but neither SWITCHYARD_PORT nor MASTER_PORT is set")
                })?;
                let master = parse_port("MASTER_PORT", &v)?;
                if get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| truthy(&v)) {
                    (port_next_to(master), PortSource::NextToAgentStore(master))
                } else {
                    (master, PortSource::Master)
                }
            }
        };
        Ok(Some(GroupEnv {
            rank,
            world,
            local_rank,
            master_addr,
            port,
            port_source,
        }))
    }

    pub fn from_env() -> Result<Option<GroupEnv>, RuntimeError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// A group of one process (NCCL loopback): no one to meet, no port.
    pub fn alone() -> GroupEnv {
        GroupEnv {
            rank: 0,
            world: 1,
            local_rank: 0,
            master_addr: "127.0.0.1".into(),
            port: 0,
            port_source: PortSource::Switchyard,
        }
    }

    /// `MASTER_ADDR:port (where the port came from)`, for messages.
    fn target(&self) -> String {
        format!(
            "{}:{} ({})",
            self.master_addr,
            self.port,
            self.port_source.describe()
        )
    }
}

/// Listens on `port` on every local address: one dual-stack IPv6 socket
/// where the host has one (it takes IPv4 connections too), and an IPv4
/// socket where IPv6 is missing or sockets are IPv6-only
/// (`net.ipv6.bindv6only=1`), so that `MASTER_ADDR` may name rank 0 by
/// either family (`localhost` resolves to `::1` first on many hosts).
pub fn listen(port: u16) -> std::io::Result<Vec<TcpListener>> {
    let v6 = TcpListener::bind((Ipv6Addr::UNSPECIFIED, port));
    let v4 = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port));
    match (v6, v4) {
        (Ok(a), Ok(b)) => Ok(vec![a, b]),
        // With dual-stack sockets (Linux's default) the IPv6 socket holds the
        // IPv4 port too, so the second bind is refused.
        (Ok(a), Err(_)) => Ok(vec![a]),
        (Err(_), Ok(b)) => Ok(vec![b]),
        (Err(_), Err(e)) => Err(e),
    }
}

/// The first message of a non-zero rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub rank: u32,
    pub world: u32,
    pub plan_hash: u64,
    /// Identifies the rank's GPU (its UUID): two ranks with one key would
    /// share a GPU, which NCCL refuses.
    pub device: [u8; KEY_LEN],
}

pub fn encode_hello(h: &Hello) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[8..12].copy_from_slice(&h.rank.to_le_bytes());
    b[12..16].copy_from_slice(&h.world.to_le_bytes());
    b[16..24].copy_from_slice(&h.plan_hash.to_le_bytes());
    b[24..40].copy_from_slice(&h.device);
    b
}

pub fn decode_hello(b: &[u8; HELLO_LEN]) -> Result<Hello, RuntimeError> {
    if &b[..4] != MAGIC {
        return Err(err("a peer that is not a switchyard process connected"));
    }
    if b[4] != VERSION {
        return Err(err(format!(
            "peer speaks protocol version {}, this process {VERSION}",
            b[4]
        )));
    }
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut h = [0u8; 8];
    h.copy_from_slice(&b[16..24]);
    let mut device = [0u8; KEY_LEN];
    device.copy_from_slice(&b[24..40]);
    Ok(Hello {
        rank: u32_at(8),
        world: u32_at(12),
        plan_hash: u64::from_le_bytes(h),
        device,
    })
}

pub fn encode_welcome(id: &[u8; ID_LEN]) -> [u8; WELCOME_LEN] {
    let mut b = [0u8; WELCOME_LEN];
    b[..4].copy_from_slice(MAGIC);
    b[5..].copy_from_slice(id);
    b
}

/// Rank 0's refusal: status 1 and the reason.
pub fn encode_refusal(reason: &str) -> Vec<u8> {
    let msg = &reason.as_bytes()[..reason.len().min(MAX_MESSAGE)];
    let mut b = Vec::with_capacity(9 + msg.len());
    b.extend_from_slice(MAGIC);
    b.push(1);
    b.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    b.extend_from_slice(msg);
    b
}

/// Reads rank 0's answer: the id, or its refusal as an error.
pub fn read_welcome(s: &mut impl Read) -> Result<[u8; ID_LEN], RuntimeError> {
    let what = "waiting for rank 0's answer";
    let mut head = [0u8; 5];
    s.read_exact(&mut head).map_err(io(what))?;
    if &head[..4] != MAGIC {
        return Err(err("rank 0 answered with something that is not a welcome"));
    }
    match head[4] {
        0 => {
            let mut id = [0u8; ID_LEN];
            s.read_exact(&mut id).map_err(io(what))?;
            Ok(id)
        }
        1 => {
            let msg = read_message(s, what)?;
            Err(err(format!("rank 0 refused the group: {msg}")))
        }
        k => Err(err(format!("rank 0 answered with unknown status {k}"))),
    }
}

/// A length-prefixed UTF-8 message (length u32).
fn read_message(s: &mut impl Read, what: &str) -> Result<String, RuntimeError> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n).map_err(io(what))?;
    let len = u32::from_le_bytes(n) as usize;
    if len > MAX_MESSAGE {
        return Err(err(format!("{what}: a message of {len} bytes")));
    }
    let mut msg = vec![0u8; len];
    s.read_exact(&mut msg).map_err(io(what))?;
    Ok(String::from_utf8_lossy(&msg).into_owned())
}

/// A 64-bit FNV-1a hash (plans are compared by the hash of their JSON).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// A rank's verdict, or the group's: wrong bytes, the first wrong range,
/// the first iteration (from 1) that was wrong.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankVerdict {
    pub bad_bytes: u64,
    pub first_bad: Option<String>,
    pub bad_iteration: Option<u32>,
}

impl RankVerdict {
    fn encode(&self) -> Vec<u8> {
        let msg = self.first_bad.as_deref().unwrap_or("").as_bytes();
        let msg = &msg[..msg.len().min(MAX_MESSAGE)];
        let mut b = Vec::with_capacity(16 + msg.len());
        b.extend_from_slice(&self.bad_bytes.to_le_bytes());
        b.extend_from_slice(&self.bad_iteration.unwrap_or(0).to_le_bytes());
        b.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        b.extend_from_slice(msg);
        b
    }

    fn read(s: &mut impl Read, what: &str) -> Result<RankVerdict, RuntimeError> {
        let mut h = [0u8; 12];
        s.read_exact(&mut h).map_err(io(what))?;
        let mut n = [0u8; 8];
        n.copy_from_slice(&h[..8]);
        let it = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        let msg = read_message(s, what)?;
        Ok(RankVerdict {
            bad_bytes: u64::from_le_bytes(n),
            first_bad: (!msg.is_empty()).then_some(msg),
            bad_iteration: (it > 0).then_some(it),
        })
    }

    /// The group's verdict from every rank's, in rank order: wrong bytes
    /// add up, the first wrong range is the lowest rank's, the iteration
    /// the earliest.
    pub fn merge(all: &[RankVerdict]) -> RankVerdict {
        RankVerdict {
            bad_bytes: all.iter().fold(0u64, |a, v| a.saturating_add(v.bad_bytes)),
            first_bad: all.iter().find_map(|v| v.first_bad.clone()),
            bad_iteration: all.iter().filter_map(|v| v.bad_iteration).min(),
        }
    }
}

/// Two ranks that would share a GPU, as a refusal naming the fix; `keys`
/// holds `(rank, device key)` of every rank.
pub fn shared_device(keys: &[(usize, [u8; KEY_LEN])]) -> Option<String> {
    let mut sorted: Vec<&(usize, [u8; KEY_LEN])> = keys.iter().collect();
    sorted.sort_by_key(|(r, k)| (*k, *r));
    let (a, b) = sorted
        .windows(2)
        .find(|w| w[0].1 == w[1].1)
        .map(|w| (w[0], w[1]))?;
    let hex: String = a.1.iter().map(|x| format!("{x:02x}")).collect();
    Some(format!(
        "ranks {} and {} would both run on GPU {hex}: NCCL needs a GPU of its own for every rank, \
         and a node runs more ranks than it has visible GPUs (each rank takes device \
         LOCAL_RANK % visible devices); start at most as many ranks per node as \
         CUDA_VISIBLE_DEVICES lists GPUs, or make more GPUs visible",
        a.0, b.0
    ))
}

/// The open connections after the id exchange: rank 0 holds one per other
/// rank (indexed by rank - 1), every other rank one to rank 0.
pub struct Rendezvous {
    rank: usize,
    peers: Vec<TcpStream>,
}

fn io(what: &str) -> impl Fn(std::io::Error) -> RuntimeError + '_ {
    move |e| err(format!("{what}: {e}"))
}

/// Seconds, for messages.
fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

impl Rendezvous {
    /// Exchanges the NCCL id: rank 0 calls `make_id` and sends its bytes to
    /// everyone; the others receive them. `device` identifies this rank's
    /// GPU. Fails after `timeout`.
    pub fn exchange(
        env: &GroupEnv,
        plan_hash: u64,
        device: [u8; KEY_LEN],
        timeout: Duration,
        make_id: impl FnOnce() -> Result<[u8; ID_LEN], RuntimeError>,
    ) -> Result<([u8; ID_LEN], Rendezvous), RuntimeError> {
        let deadline = Instant::now() + timeout;
        if env.world == 1 {
            // A group of one: nobody to meet, nothing to listen on.
            let id = make_id()?;
            return Ok((
                id,
                Rendezvous {
                    rank: 0,
                    peers: Vec::new(),
                },
            ));
        }
        if env.rank == 0 {
            let listeners = listen(env.port).map_err(|e| {
                err(format!(
                    "rank 0 cannot listen on port {} ({}): {e}; {}",
                    env.port,
                    env.port_source.describe(),
                    env.port_source.fix()
                ))
            })?;
            Self::serve(listeners, env.world, plan_hash, device, deadline, make_id)
        } else {
            let hello = Hello {
                rank: env.rank as u32,
                world: env.world as u32,
                plan_hash,
                device,
            };
            let target = env.target();
            let resolve = || {
                (env.master_addr.as_str(), env.port)
                    .to_socket_addrs()
                    .map(Vec::from_iter)
            };
            Self::join(resolve, &target, &hello, deadline)
        }
    }

    /// Rank 0's side, on already bound listeners; `device` is rank 0's own
    /// GPU key.
    pub fn serve(
        listeners: Vec<TcpListener>,
        world: usize,
        plan_hash: u64,
        device: [u8; KEY_LEN],
        deadline: Instant,
        make_id: impl FnOnce() -> Result<[u8; ID_LEN], RuntimeError>,
    ) -> Result<([u8; ID_LEN], Rendezvous), RuntimeError> {
        let id = make_id()?;
        for l in &listeners {
            l.set_nonblocking(true).map_err(io("listener set-up"))?;
        }
        let mut peers: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        let mut keys = vec![(0usize, device)];
        let mut joined = 0;
        while joined + 1 < world {
            let mut accepted = None;
            for l in &listeners {
                match l.accept() {
                    Ok(c) => {
                        accepted = Some(c);
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => return Err(err(format!("accept: {e}"))),
                }
            }
            let Some((mut s, from)) = accepted else {
                if Instant::now() > deadline {
                    let missing: Vec<usize> =
                        (1..world).filter(|r| peers[r - 1].is_none()).collect();
                    let refusal = format!(
                        "only {} of {world} ranks joined before the deadline (missing: {})",
                        joined + 1,
                        list(&missing)
                    );
                    refuse(peers.iter_mut().flatten(), &refusal);
                    return Err(err(refusal));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            s.set_nonblocking(false).map_err(io("socket set-up"))?;
            set_deadline(&s, deadline, "reading a hello")?;
            let mut b = [0u8; HELLO_LEN];
            s.read_exact(&mut b)
                .map_err(io(&format!("reading hello from {from}")))?;
            let h = decode_hello(&b)?;
            if h.world as usize != world || h.plan_hash != plan_hash {
                let refusal = format!(
                    "rank {} runs another job (world size {}, plan hash {:016x}; rank 0: {world}, {plan_hash:016x})",
                    h.rank, h.world, h.plan_hash
                );
                refuse(peers.iter_mut().flatten().chain([&mut s]), &refusal);
                return Err(err(refusal));
            }
            let slot = (h.rank as usize)
                .checked_sub(1)
                .and_then(|i| peers.get_mut(i))
                .ok_or_else(|| err(format!("bad rank {} in hello", h.rank)))?;
            if slot.is_some() {
                let refusal = format!("two processes claim rank {}", h.rank);
                refuse(peers.iter_mut().flatten().chain([&mut s]), &refusal);
                return Err(err(refusal));
            }
            *slot = Some(s);
            keys.push((h.rank as usize, h.device));
            joined += 1;
        }
        let mut peers: Vec<TcpStream> = peers.into_iter().flatten().collect();
        if let Some(refusal) = shared_device(&keys) {
            refuse(peers.iter_mut(), &refusal);
            return Err(err(refusal));
        }
        // Everyone is here: only now hand out the id, so that no rank enters
        // NCCL's initialisation while another may still be missing.
        for (i, mut s) in peers.iter().enumerate() {
            s.write_all(&encode_welcome(&id))
                .map_err(io(&format!("sending the NCCL id to rank {}", i + 1)))?;
        }
        Ok((id, Rendezvous { rank: 0, peers }))
    }

    /// A non-zero rank's side: connects to rank 0, trying every address
    /// `resolve` gives (resolved again each round, since a name may appear
    /// late), until `deadline`; then hello and welcome.
    pub fn join(
        resolve: impl Fn() -> std::io::Result<Vec<SocketAddr>>,
        target: &str,
        hello: &Hello,
        deadline: Instant,
    ) -> Result<([u8; ID_LEN], Rendezvous), RuntimeError> {
        let start = Instant::now();
        let mut last: String;
        let mut s = 'connect: loop {
            match resolve() {
                Ok(addrs) if addrs.is_empty() => last = "the name resolves to no address".into(),
                Ok(addrs) => {
                    let mut errors = Vec::new();
                    for a in &addrs {
                        let left = deadline.saturating_duration_since(Instant::now());
                        let wait = left
                            .min(Duration::from_secs(1))
                            .max(Duration::from_millis(10));
                        match TcpStream::connect_timeout(a, wait) {
                            Ok(s) => break 'connect s,
                            Err(e) => errors.push(format!("{a}: {e}")),
                        }
                    }
                    last = errors.join(", ");
                }
                Err(e) => last = format!("cannot resolve the name: {e}"),
            }
            if Instant::now() >= deadline {
                return Err(err(format!(
                    "cannot reach rank 0 at {target} within {} ({last})",
                    secs(deadline.saturating_duration_since(start))
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        set_deadline(&s, deadline, "waiting for rank 0's answer")?;
        s.write_all(&encode_hello(hello))
            .map_err(io("sending hello"))?;
        let id = read_welcome(&mut s)?;
        Ok((
            id,
            Rendezvous {
                rank: hello.rank as usize,
                peers: vec![s],
            },
        ))
    }

    /// Ends the run for the group: every rank sends its verdict to rank 0,
    /// which merges them and sends the group's verdict back to each rank;
    /// every rank returns the group's verdict. No rank returns before every
    /// rank has sent its verdict, i.e. finished its transfers: this is the
    /// barrier before anyone tears NCCL down. Fails after `timeout`.
    pub fn finish(
        &mut self,
        mine: &RankVerdict,
        timeout: Duration,
    ) -> Result<RankVerdict, RuntimeError> {
        let deadline = Instant::now() + timeout;
        if self.rank != 0 {
            let s = &mut self.peers[0];
            set_deadline(s, deadline, "sending the verdict")?;
            s.write_all(&mine.encode())
                .map_err(io("sending the verdict"))?;
            set_deadline(s, deadline, "waiting for the group's verdict")?;
            return RankVerdict::read(s, "waiting for the group's verdict from rank 0");
        }
        let mut all = vec![mine.clone()];
        for (i, s) in self.peers.iter_mut().enumerate() {
            let what = format!("verdict of rank {}", i + 1);
            set_deadline(s, deadline, &what)?;
            all.push(RankVerdict::read(s, &what)?);
        }
        let group = RankVerdict::merge(&all);
        let bytes = group.encode();
        for (i, s) in self.peers.iter_mut().enumerate() {
            let what = format!("sending the group's verdict to rank {}", i + 1);
            set_deadline(s, deadline, &what)?;
            s.write_all(&bytes).map_err(io(&what))?;
        }
        Ok(group)
    }
}

/// Tells every peer why rank 0 gives up (best effort: a peer that cannot
/// be told fails at its deadline instead).
fn refuse<'a>(peers: impl Iterator<Item = &'a mut TcpStream>, reason: &str) {
    let b = encode_refusal(reason);
    for s in peers {
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = s.write_all(&b);
    }
}

fn list(ranks: &[usize]) -> String {
    const SHOWN: usize = 16;
    let mut s: Vec<String> = ranks.iter().take(SHOWN).map(|r| r.to_string()).collect();
    if ranks.len() > SHOWN {
        s.push(format!("and {} more", ranks.len() - SHOWN));
    }
    s.join(", ")
}

/// Sets the socket's read and write timeouts to the time left before
/// `deadline`; fails at once, naming `what`, when none is left.
fn set_deadline(s: &TcpStream, deadline: Instant, what: &str) -> Result<(), RuntimeError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(err(format!("{what}: the deadline has passed")));
    }
    s.set_read_timeout(Some(left))
        .and_then(|_| s.set_write_timeout(Some(left)))
        .map_err(io("socket timeout"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn env(pairs: &[(&str, &str)]) -> Result<Option<GroupEnv>, RuntimeError> {
        GroupEnv::from_vars(vars(pairs))
    }

    fn key(r: u8) -> [u8; KEY_LEN] {
        [r; KEY_LEN]
    }

    /// A loopback group member's environment, on `port`.
    fn member(rank: usize, world: usize, port: u16) -> GroupEnv {
        GroupEnv {
            rank,
            world,
            local_rank: rank,
            master_addr: "127.0.0.1".into(),
            port,
            port_source: PortSource::Switchyard,
        }
    }

    /// A port that was free a moment ago.
    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn env_parsing() {
        assert_eq!(env(&[]).unwrap(), None);
        let e = env(&[
            ("WORLD_SIZE", "16"),
            ("RANK", "9"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world, e.local_rank), (9, 16, 1));
        assert_eq!((e.master_addr.as_str(), e.port), ("node0", 29500));
        assert_eq!(e.port_source, PortSource::Master);
        let e = env(&[
            ("WORLD_SIZE", "2"),
            ("RANK", "1"),
            ("MASTER_PORT", "29500"),
            ("SWITCHYARD_PORT", "29611"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (e.local_rank, e.master_addr.as_str(), e.port),
            (1, "127.0.0.1", 29611)
        );
        assert_eq!(e.port_source, PortSource::Switchyard);
        let bad = env(&[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_PORT", "1")]);
        assert_eq!(
            bad.unwrap_err().to_string(),
            "bootstrap: RANK=2 is not below WORLD_SIZE=2"
        );
        let bad = env(&[("WORLD_SIZE", "2"), ("RANK", "0")]);
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("neither SWITCHYARD_PORT nor MASTER_PORT is set"),
            "no port at all"
        );
    }

    #[test]
    fn a_bad_port_is_reported_under_its_own_name() {
        for (name, v) in [
            ("SWITCHYARD_PORT", "70000"),
            ("SWITCHYARD_PORT", "0"),
            ("SWITCHYARD_PORT", "http"),
            ("MASTER_PORT", "-1"),
            ("MASTER_PORT", "65536"),
        ] {
            let mut pairs = vec![("WORLD_SIZE", "2"), ("RANK", "0")];
            if name == "SWITCHYARD_PORT" {
                pairs.push(("MASTER_PORT", "29500"));
            }
            pairs.push((name, v));
            let e = env(&pairs).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("bootstrap: {name}=`{v}` is not a TCP port (1 to 65535)"),
                "{name}={v}"
            );
        }
    }

    #[test]
    fn under_torchrun_the_port_next_to_its_store_is_used() {
        let base = [
            ("WORLD_SIZE", "16"),
            ("RANK", "3"),
            ("MASTER_PORT", "29500"),
        ];
        for flag in ["True", "true", "1"] {
            let mut pairs = base.to_vec();
            pairs.push(("TORCHELASTIC_USE_AGENT_STORE", flag));
            let e = env(&pairs).unwrap().unwrap();
            assert_eq!(e.port, 29501, "{flag}");
            assert_eq!(e.port_source, PortSource::NextToAgentStore(29500));
            assert!(e.port_source.describe().contains("MASTER_PORT=29500"));
        }
        // torchrun without its agent store: MASTER_PORT is free for us.
        let mut pairs = base.to_vec();
        pairs.push(("TORCHELASTIC_USE_AGENT_STORE", "False"));
        assert_eq!(env(&pairs).unwrap().unwrap().port, 29500);
        // SWITCHYARD_PORT still wins.
        let mut pairs = base.to_vec();
        pairs.push(("TORCHELASTIC_USE_AGENT_STORE", "True"));
        pairs.push(("SWITCHYARD_PORT", "29600"));
        assert_eq!(env(&pairs).unwrap().unwrap().port, 29600);
        assert_eq!(port_next_to(65535), 65534);
    }

    #[test]
    fn rank_0_that_cannot_listen_names_the_variable_and_the_fix() {
        // Hold a port on every address, as torchrun's store does.
        let port = free_port();
        let _held = listen(port).unwrap();
        for (source, fix) in [
            (
                PortSource::NextToAgentStore(port - 1),
                "set SWITCHYARD_PORT",
            ),
            (PortSource::Switchyard, "SWITCHYARD_PORT"),
        ] {
            let env = GroupEnv {
                port_source: source,
                ..member(0, 2, port)
            };
            let e =
                Rendezvous::exchange(&env, 1, key(0), Duration::from_secs(1), || Ok([0; ID_LEN]))
                    .err()
                    .unwrap()
                    .to_string();
            assert!(e.contains(&format!("cannot listen on port {port}")), "{e}");
            assert!(e.contains(&source.describe()), "{e}");
            assert!(e.contains(fix), "{e}");
        }
    }

    #[test]
    fn messages_round_trip_and_reject_garbage() {
        let h = Hello {
            rank: 7,
            world: 16,
            plan_hash: 0xdead_beef_0123_4567,
            device: key(9),
        };
        let b = encode_hello(&h);
        assert_eq!(&b[..4], b"SWYD");
        assert_eq!(decode_hello(&b).unwrap(), h);
        let mut g = b;
        g[0] = b'X';
        assert!(decode_hello(&g).is_err());
        let mut g = b;
        g[4] = 9;
        assert!(decode_hello(&g)
            .unwrap_err()
            .to_string()
            .contains("version 9"));
        let id: [u8; ID_LEN] = std::array::from_fn(|i| i as u8);
        assert_eq!(read_welcome(&mut &encode_welcome(&id)[..]).unwrap(), id);
        let e = read_welcome(&mut &encode_refusal("no room")[..]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bootstrap: rank 0 refused the group: no room"
        );
        assert!(read_welcome(&mut &b"SWYD"[..]).is_err());
        assert_ne!(fnv1a(b"plan a"), fnv1a(b"plan b"));
        let v = RankVerdict {
            bad_bytes: 12,
            first_bad: Some("output of rank 1 ...".into()),
            bad_iteration: Some(3),
        };
        assert_eq!(RankVerdict::read(&mut &v.encode()[..], "x").unwrap(), v);
        let clean = RankVerdict::default();
        assert_eq!(
            RankVerdict::read(&mut &clean.encode()[..], "x").unwrap(),
            clean
        );
    }

    #[test]
    fn verdicts_merge_in_rank_order() {
        let v = |b: u64, m: Option<&str>, it: Option<u32>| RankVerdict {
            bad_bytes: b,
            first_bad: m.map(str::to_string),
            bad_iteration: it,
        };
        let all = [
            v(0, None, None),
            v(5, Some("rank 1"), Some(4)),
            v(u64::MAX, Some("rank 2"), Some(2)),
        ];
        assert_eq!(
            RankVerdict::merge(&all),
            v(u64::MAX, Some("rank 1"), Some(2))
        );
        assert_eq!(RankVerdict::merge(&all[..1]), RankVerdict::default());
    }

    #[test]
    fn two_ranks_on_one_gpu_are_named() {
        assert_eq!(
            shared_device(&[(0, key(1)), (1, key(2)), (2, key(3))]),
            None
        );
        let m = shared_device(&[(0, key(1)), (3, key(2)), (1, key(2))]).unwrap();
        assert!(
            m.starts_with("ranks 1 and 3 would both run on GPU 0202"),
            "{m}"
        );
        assert!(m.contains("CUDA_VISIBLE_DEVICES"), "{m}");
    }

    /// Runs a loopback group of `world` ranks, rank `r` with device key
    /// `keys[r]`; each non-zero rank's result comes back in rank order, rank
    /// 0's first.
    fn group(
        world: usize,
        keys: Vec<[u8; KEY_LEN]>,
        timeout: Duration,
    ) -> Vec<Result<([u8; ID_LEN], Rendezvous), RuntimeError>> {
        let port = free_port();
        let listeners = listen(port).unwrap();
        let id: [u8; ID_LEN] = std::array::from_fn(|i| (i * 3) as u8);
        let clients: Vec<_> = (1..world)
            .map(|rank| {
                let k = keys[rank];
                std::thread::spawn(move || {
                    Rendezvous::exchange(&member(rank, world, port), 42, k, timeout, || {
                        unreachable!("only rank 0 makes the id")
                    })
                })
            })
            .collect();
        let deadline = Instant::now() + timeout;
        let mut out = vec![Rendezvous::serve(
            listeners,
            world,
            42,
            keys[0],
            deadline,
            || Ok(id),
        )];
        out.extend(clients.into_iter().map(|c| c.join().unwrap()));
        out
    }

    #[test]
    fn loopback_exchange_verdicts_and_barrier() {
        let world = 3;
        let keys = (0..world as u8).map(key).collect();
        let mut all = group(world, keys, Duration::from_secs(10));
        let ids: Vec<[u8; ID_LEN]> = all.iter().map(|r| r.as_ref().unwrap().0).collect();
        assert!(ids.iter().all(|i| *i == ids[0]));
        let mut rvs: Vec<Rendezvous> = all.drain(..).map(|r| r.unwrap().1).collect();
        let rank0 = rvs.remove(0);
        // Ranks 1 and 2 send their verdicts from threads; every rank gets the
        // group's verdict back.
        let others: Vec<_> = rvs
            .into_iter()
            .enumerate()
            .map(|(i, mut rv)| {
                std::thread::spawn(move || {
                    let rank = i + 1;
                    let mine = RankVerdict {
                        bad_bytes: rank as u64,
                        first_bad: (rank == 2).then(|| "rank 2 is wrong".to_string()),
                        bad_iteration: (rank == 2).then_some(1),
                    };
                    rv.finish(&mine, Duration::from_secs(10)).unwrap()
                })
            })
            .collect();
        let mut rank0 = rank0;
        let group = rank0
            .finish(&RankVerdict::default(), Duration::from_secs(10))
            .unwrap();
        let want = RankVerdict {
            bad_bytes: 3,
            first_bad: Some("rank 2 is wrong".into()),
            bad_iteration: Some(1),
        };
        assert_eq!(group, want);
        for o in others {
            assert_eq!(o.join().unwrap(), want);
        }
    }

    #[test]
    fn no_rank_passes_the_barrier_before_every_verdict_is_in() {
        let mut all = group(3, (0..3).map(key).collect(), Duration::from_secs(10));
        let mut rvs: Vec<Rendezvous> = all.drain(..).map(|r| r.unwrap().1).collect();
        let late = rvs.pop().unwrap();
        let mut early = rvs.pop().unwrap();
        let mut rank0 = rvs.pop().unwrap();
        let t0 = Instant::now();
        let r0 = std::thread::spawn(move || {
            rank0
                .finish(&RankVerdict::default(), Duration::from_secs(10))
                .unwrap()
        });
        let early = std::thread::spawn(move || {
            early
                .finish(&RankVerdict::default(), Duration::from_secs(10))
                .unwrap();
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(300));
        let mut late = late;
        late.finish(&RankVerdict::default(), Duration::from_secs(10))
            .unwrap();
        assert!(early.join().unwrap() >= Duration::from_millis(300));
        r0.join().unwrap();
    }

    #[test]
    fn two_ranks_given_one_gpu_are_refused_everywhere_at_once() {
        let t0 = Instant::now();
        let all = group(3, vec![key(1), key(7), key(7)], Duration::from_secs(20));
        assert!(t0.elapsed() < Duration::from_secs(5));
        for r in all {
            let e = r.err().unwrap().to_string();
            assert!(e.contains("ranks 1 and 2 would both run on GPU"), "{e}");
            assert!(e.contains("CUDA_VISIBLE_DEVICES"), "{e}");
        }
    }

    #[test]
    fn a_missing_rank_fails_everyone_at_the_deadline() {
        let port = free_port();
        let listeners = listen(port).unwrap();
        let client = std::thread::spawn(move || {
            Rendezvous::exchange(
                &member(1, 3, port),
                5,
                key(1),
                Duration::from_millis(2000),
                || Ok([0; ID_LEN]),
            )
            .err()
            .map(|e| e.to_string())
        });
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_millis(300);
        let e = Rendezvous::serve(listeners, 3, 5, key(0), deadline, || Ok([1; ID_LEN]))
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("only 2 of 3 ranks joined before the deadline (missing: 2)"),
            "{e}"
        );
        assert!(t0.elapsed() < Duration::from_millis(1500));
        // Rank 1 never got the id; it heard why at once, not at its deadline.
        let msg = client.join().unwrap().unwrap();
        assert!(msg.contains("refused the group: only 2 of 3"), "{msg}");
        assert!(t0.elapsed() < Duration::from_millis(1500));
    }

    #[test]
    fn a_different_plan_is_refused() {
        let port = free_port();
        let listeners = listen(port).unwrap();
        let client = std::thread::spawn(move || {
            Rendezvous::exchange(
                &member(1, 2, port),
                1,
                key(1),
                Duration::from_secs(5),
                || Ok([0; ID_LEN]),
            )
            .err()
            .map(|e| e.to_string())
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = Rendezvous::serve(listeners, 2, 2, key(0), deadline, || Ok([0; ID_LEN]))
            .err()
            .unwrap();
        assert!(e.to_string().contains("runs another job"), "{e}");
        let msg = client.join().unwrap().unwrap();
        assert!(msg.contains("runs another job"), "{msg}");
    }

    #[test]
    fn a_joiner_without_rank_0_fails_at_its_deadline_naming_the_target() {
        let port = free_port();
        let env = GroupEnv {
            port_source: PortSource::NextToAgentStore(port - 1),
            ..member(1, 2, port)
        };
        let t0 = Instant::now();
        let e = Rendezvous::exchange(&env, 1, key(1), Duration::from_millis(400), || {
            Ok([0; ID_LEN])
        })
        .err()
        .unwrap()
        .to_string();
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(400), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert!(
            e.contains(&format!("cannot reach rank 0 at 127.0.0.1:{port}")),
            "{e}"
        );
        assert!(e.contains("torchrun's own store"), "{e}");
        assert!(e.contains("within 0.4 s"), "{e}");
    }

    #[test]
    fn every_resolved_address_is_tried() {
        // The first address refuses connections; the second is rank 0.
        let port = free_port();
        let listeners = listen(port).unwrap();
        let dead: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let live: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let client = std::thread::spawn(move || {
            let hello = Hello {
                rank: 1,
                world: 2,
                plan_hash: 9,
                device: key(1),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            Rendezvous::join(|| Ok(vec![dead, live]), "test", &hello, deadline).map(|r| r.0)
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let (id, _rv) =
            Rendezvous::serve(listeners, 2, 9, key(0), deadline, || Ok([4; ID_LEN])).unwrap();
        assert_eq!(client.join().unwrap().unwrap(), id);
    }

    #[test]
    fn a_name_that_resolves_late_is_retried() {
        let port = free_port();
        let listeners = listen(port).unwrap();
        let live: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let tries = std::sync::atomic::AtomicUsize::new(0);
        let client = std::thread::spawn(move || {
            let hello = Hello {
                rank: 1,
                world: 2,
                plan_hash: 9,
                device: key(1),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            let resolve = || match tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 => Err(std::io::Error::other("no such host yet")),
                1 => Ok(vec![]),
                _ => Ok(vec![live]),
            };
            Rendezvous::join(resolve, "test", &hello, deadline).map(|r| r.0)
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let (id, _rv) =
            Rendezvous::serve(listeners, 2, 9, key(0), deadline, || Ok([4; ID_LEN])).unwrap();
        assert_eq!(client.join().unwrap().unwrap(), id);
    }

    #[test]
    fn localhost_reaches_rank_0_whichever_family_it_resolves_to() {
        let port = free_port();
        let listeners = listen(port).unwrap();
        let client = std::thread::spawn(move || {
            let env = GroupEnv {
                master_addr: "localhost".into(),
                ..member(1, 2, port)
            };
            Rendezvous::exchange(&env, 3, key(1), Duration::from_secs(10), || Ok([0; ID_LEN]))
                .map(|r| r.0)
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let (id, _rv) =
            Rendezvous::serve(listeners, 2, 3, key(0), deadline, || Ok([8; ID_LEN])).unwrap();
        assert_eq!(client.join().unwrap().unwrap(), id);
    }

    #[test]
    fn listen_takes_both_families() {
        let port = free_port();
        let ls = listen(port).unwrap();
        assert!(!ls.is_empty());
        TcpStream::connect(("127.0.0.1", port)).unwrap();
        // IPv6 loopback where the host has it.
        if TcpListener::bind("[::1]:0").is_ok() {
            TcpStream::connect(("::1", port)).unwrap();
        }
    }

    #[test]
    fn a_group_of_one_needs_no_network() {
        let (id, mut rv) = Rendezvous::exchange(
            &GroupEnv::alone(),
            1,
            key(0),
            Duration::from_secs(1),
            || Ok([6; ID_LEN]),
        )
        .unwrap();
        assert_eq!(id, [6; ID_LEN]);
        let mine = RankVerdict {
            bad_bytes: 1,
            first_bad: Some("x".into()),
            bad_iteration: Some(2),
        };
        assert_eq!(rv.finish(&mine, Duration::from_secs(1)).unwrap(), mine);
    }

    #[test]
    fn an_expired_deadline_fails_at_once() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let e = set_deadline(&s, Instant::now(), "reading").unwrap_err();
        assert_eq!(e.to_string(), "bootstrap: reading: the deadline has passed");
    }
}
