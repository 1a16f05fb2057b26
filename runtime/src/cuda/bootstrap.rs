//! Process-group bootstrap for one process per GPU, from torchrun-style
//! environment variables, over plain TCP (std::net).
//!
//! Rank 0 listens on `MASTER_ADDR:MASTER_PORT`. Every other rank connects
//! (retrying until the deadline, since rank 0 may start later) and sends a
//! hello: magic, protocol version, its rank, the world size and a hash of the
//! plan, so that processes running different plans or sizes fail at once
//! instead of hanging in NCCL. Once every rank has said hello, rank 0
//! answers each with the 128-byte NCCL unique id (a missing rank makes every
//! process fail at the deadline, none waits inside NCCL). After the run, every rank sends its verdict (wrong-byte count
//! and first wrong range) on the same connection and rank 0 merges them.
//!
//! Messages (little endian):
//! - hello, 24 bytes: `"SWYD"`, version u8, 3 zero bytes, rank u32, world u32, plan hash u64;
//! - welcome, 133 bytes: `"SWYD"`, status u8 (0 = ok), the 128 id bytes;
//! - verdict: bad bytes u64, message length u32, UTF-8 message (empty when clean).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::RuntimeError;

const MAGIC: &[u8; 4] = b"SWYD";
const VERSION: u8 = 1;
pub const HELLO_LEN: usize = 24;
pub const ID_LEN: usize = 128;
pub const WELCOME_LEN: usize = 5 + ID_LEN;

fn err(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Bootstrap(msg.into())
}

/// This process's place in the group, from `RANK`, `WORLD_SIZE`,
/// `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT` (or `SWITCHYARD_PORT`, which
/// takes precedence).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupEnv {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
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
        let master_addr = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        // SWITCHYARD_PORT wins: a launcher's own store may already hold MASTER_PORT.
        let port = match get("SWITCHYARD_PORT") {
            Some(v) => num("SWITCHYARD_PORT", Some(v))?,
            None => num("MASTER_PORT", get("MASTER_PORT"))?,
        };
        let master_port =
            u16::try_from(port).map_err(|_| err(format!("MASTER_PORT={port} is not a port")))?;
        if world == 0 || rank >= world {
            return Err(err(format!("RANK={rank} is not below WORLD_SIZE={world}")));
        }
        Ok(Some(GroupEnv {
            rank,
            world,
            local_rank,
            master_addr,
            master_port,
        }))
    }

    pub fn from_env() -> Result<Option<GroupEnv>, RuntimeError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }
}

/// The first message of a non-zero rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub rank: u32,
    pub world: u32,
    pub plan_hash: u64,
}

pub fn encode_hello(h: &Hello) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[8..12].copy_from_slice(&h.rank.to_le_bytes());
    b[12..16].copy_from_slice(&h.world.to_le_bytes());
    b[16..24].copy_from_slice(&h.plan_hash.to_le_bytes());
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
    Ok(Hello {
        rank: u32_at(8),
        world: u32_at(12),
        plan_hash: u64::from_le_bytes(h),
    })
}

pub fn encode_welcome(id: &[u8; ID_LEN]) -> [u8; WELCOME_LEN] {
    let mut b = [0u8; WELCOME_LEN];
    b[..4].copy_from_slice(MAGIC);
    b[5..].copy_from_slice(id);
    b
}

pub fn decode_welcome(b: &[u8; WELCOME_LEN]) -> Result<[u8; ID_LEN], RuntimeError> {
    if &b[..4] != MAGIC || b[4] != 0 {
        return Err(err("rank 0 refused this process (bad magic or status)"));
    }
    let mut id = [0u8; ID_LEN];
    id.copy_from_slice(&b[5..]);
    Ok(id)
}

/// A 64-bit FNV-1a hash (plans are compared by the hash of their JSON).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// One rank's verdict: wrong bytes, first wrong range.
pub type RankVerdict = (u64, Option<String>);

/// The open connections after the id exchange: rank 0 holds one per other
/// rank (indexed by rank - 1), every other rank one to rank 0.
pub struct Rendezvous {
    rank: usize,
    peers: Vec<TcpStream>,
}

fn io(what: &str) -> impl Fn(std::io::Error) -> RuntimeError + '_ {
    move |e| err(format!("{what}: {e}"))
}

impl Rendezvous {
    /// Exchanges the NCCL id: rank 0 calls `make_id` and sends its bytes to
    /// everyone; the others receive them. Fails after `timeout`.
    pub fn exchange(
        env: &GroupEnv,
        plan_hash: u64,
        timeout: Duration,
        make_id: impl FnOnce() -> Result<[u8; ID_LEN], RuntimeError>,
    ) -> Result<([u8; ID_LEN], Rendezvous), RuntimeError> {
        let deadline = Instant::now() + timeout;
        let addr = format!("{}:{}", env.master_addr, env.master_port);
        if env.rank == 0 {
            let listener = TcpListener::bind(("0.0.0.0", env.master_port)).map_err(io(
                &format!("rank 0 cannot listen on port {}", env.master_port),
            ))?;
            Self::serve(listener, env.world, plan_hash, deadline, make_id)
        } else {
            Self::join(&addr, env, plan_hash, deadline)
        }
    }

    /// Rank 0's side, on an already bound listener.
    pub fn serve(
        listener: TcpListener,
        world: usize,
        plan_hash: u64,
        deadline: Instant,
        make_id: impl FnOnce() -> Result<[u8; ID_LEN], RuntimeError>,
    ) -> Result<([u8; ID_LEN], Rendezvous), RuntimeError> {
        let id = make_id()?;
        listener
            .set_nonblocking(true)
            .map_err(io("listener set-up"))?;
        let mut peers: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        let mut joined = 0;
        while joined + 1 < world {
            match listener.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false).map_err(io("socket set-up"))?;
                    set_deadline(&s, deadline)?;
                    let mut b = [0u8; HELLO_LEN];
                    s.read_exact(&mut b)
                        .map_err(io(&format!("reading hello from {from}")))?;
                    let h = decode_hello(&b)?;
                    if h.world as usize != world || h.plan_hash != plan_hash {
                        return Err(err(format!(
                            "rank {} runs another job (world size {}, plan hash {:016x}; here {world}, {plan_hash:016x})",
                            h.rank, h.world, h.plan_hash
                        )));
                    }
                    let slot = (h.rank as usize)
                        .checked_sub(1)
                        .and_then(|i| peers.get_mut(i))
                        .ok_or_else(|| err(format!("bad rank {} in hello", h.rank)))?;
                    if slot.is_some() {
                        return Err(err(format!("two processes claim rank {}", h.rank)));
                    }
                    *slot = Some(s);
                    joined += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(err(format!(
                            "only {} of {} ranks joined before the deadline",
                            joined + 1,
                            world
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(err(format!("accept: {e}"))),
            }
        }
        // Everyone is here: only now hand out the id, so that no rank enters
        // NCCL's initialisation (which waits without a deadline) while
        // another may still be missing.
        let peers: Vec<TcpStream> = peers.into_iter().flatten().collect();
        for (i, mut s) in peers.iter().enumerate() {
            s.write_all(&encode_welcome(&id))
                .map_err(io(&format!("sending the NCCL id to rank {}", i + 1)))?;
        }
        Ok((id, Rendezvous { rank: 0, peers }))
    }

    fn join(
        addr: &str,
        env: &GroupEnv,
        plan_hash: u64,
        deadline: Instant,
    ) -> Result<([u8; ID_LEN], Rendezvous), RuntimeError> {
        let target = addr
            .to_socket_addrs()
            .map_err(io(&format!("MASTER_ADDR:MASTER_PORT `{addr}`")))?
            .next()
            .ok_or_else(|| err(format!("`{addr}` resolves to no address")))?;
        let mut s = loop {
            match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(err(format!("cannot reach rank 0 at {addr}: {e}")))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        set_deadline(&s, deadline)?;
        let hello = Hello {
            rank: env.rank as u32,
            world: env.world as u32,
            plan_hash,
        };
        s.write_all(&encode_hello(&hello))
            .map_err(io("sending hello"))?;
        let mut b = [0u8; WELCOME_LEN];
        s.read_exact(&mut b)
            .map_err(io("waiting for rank 0's answer"))?;
        let id = decode_welcome(&b)?;
        Ok((
            id,
            Rendezvous {
                rank: env.rank,
                peers: vec![s],
            },
        ))
    }

    /// Sends this rank's verdict to rank 0; on rank 0 returns everyone's
    /// `(bad bytes, first bad range)` in rank order, elsewhere `None`.
    pub fn gather_verdicts(
        &mut self,
        bad_bytes: u64,
        first_bad: Option<&str>,
        timeout: Duration,
    ) -> Result<Option<Vec<RankVerdict>>, RuntimeError> {
        let deadline = Instant::now() + timeout;
        if self.rank != 0 {
            let s = &mut self.peers[0];
            set_deadline(s, deadline)?;
            let msg = first_bad.unwrap_or("").as_bytes();
            let mut b = Vec::with_capacity(12 + msg.len());
            b.extend_from_slice(&bad_bytes.to_le_bytes());
            b.extend_from_slice(&(msg.len() as u32).to_le_bytes());
            b.extend_from_slice(msg);
            s.write_all(&b).map_err(io("sending the verdict"))?;
            return Ok(None);
        }
        let mut all = vec![(bad_bytes, first_bad.map(str::to_string))];
        for (i, s) in self.peers.iter_mut().enumerate() {
            set_deadline(s, deadline)?;
            let what = format!("verdict of rank {}", i + 1);
            let mut h = [0u8; 12];
            s.read_exact(&mut h).map_err(io(&what))?;
            let mut n = [0u8; 8];
            n.copy_from_slice(&h[..8]);
            let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
            if len > 1 << 16 {
                return Err(err(format!("{what}: message of {len} bytes")));
            }
            let mut msg = vec![0u8; len];
            s.read_exact(&mut msg).map_err(io(&what))?;
            let msg = String::from_utf8_lossy(&msg).into_owned();
            all.push((u64::from_le_bytes(n), (!msg.is_empty()).then_some(msg)));
        }
        Ok(Some(all))
    }
}

fn set_deadline(s: &TcpStream, deadline: Instant) -> Result<(), RuntimeError> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(10));
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

    #[test]
    fn env_parsing() {
        assert_eq!(GroupEnv::from_vars(vars(&[])).unwrap(), None);
        let e = GroupEnv::from_vars(vars(&[
            ("WORLD_SIZE", "16"),
            ("RANK", "9"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world, e.local_rank), (9, 16, 1));
        assert_eq!((e.master_addr.as_str(), e.master_port), ("node0", 29500));
        let e = GroupEnv::from_vars(vars(&[
            ("WORLD_SIZE", "2"),
            ("RANK", "1"),
            ("MASTER_PORT", "29500"),
            ("SWITCHYARD_PORT", "29611"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (e.local_rank, e.master_addr.as_str(), e.master_port),
            (1, "127.0.0.1", 29611)
        );
        let bad = GroupEnv::from_vars(vars(&[
            ("WORLD_SIZE", "2"),
            ("RANK", "2"),
            ("MASTER_PORT", "1"),
        ]));
        assert_eq!(
            bad.unwrap_err().to_string(),
            "bootstrap: RANK=2 is not below WORLD_SIZE=2"
        );
        let bad = GroupEnv::from_vars(vars(&[("WORLD_SIZE", "2"), ("RANK", "0")]));
        assert!(bad.unwrap_err().to_string().contains("MASTER_PORT is not"));
    }

    #[test]
    fn messages_round_trip_and_reject_garbage() {
        let h = Hello {
            rank: 7,
            world: 16,
            plan_hash: 0xdead_beef_0123_4567,
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
        assert_eq!(decode_welcome(&encode_welcome(&id)).unwrap(), id);
        assert_ne!(fnv1a(b"plan a"), fnv1a(b"plan b"));
    }

    #[test]
    fn loopback_exchange_and_verdicts() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let world = 3;
        let id: [u8; ID_LEN] = std::array::from_fn(|i| (i * 3) as u8);
        let clients: Vec<_> = (1..world)
            .map(|rank| {
                std::thread::spawn(move || {
                    let env = GroupEnv {
                        rank,
                        world,
                        local_rank: rank,
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                    };
                    let (got, mut rv) =
                        Rendezvous::exchange(&env, 42, Duration::from_secs(10), || {
                            unreachable!("only rank 0 makes the id")
                        })
                        .unwrap();
                    let msg = (rank == 2).then_some("rank 2 is wrong");
                    rv.gather_verdicts(rank as u64, msg, Duration::from_secs(10))
                        .unwrap();
                    got
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        let (sent, mut rv) = Rendezvous::serve(listener, world, 42, deadline, || Ok(id)).unwrap();
        let all = rv
            .gather_verdicts(0, None, Duration::from_secs(10))
            .unwrap()
            .unwrap();
        for c in clients {
            assert_eq!(c.join().unwrap(), sent);
        }
        assert_eq!(
            all,
            vec![(0, None), (1, None), (2, Some("rank 2 is wrong".into()))]
        );
    }

    #[test]
    fn a_missing_rank_fails_everyone_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::thread::spawn(move || {
            let env = GroupEnv {
                rank: 1,
                world: 3,
                local_rank: 1,
                master_addr: "127.0.0.1".into(),
                master_port: port,
            };
            Rendezvous::exchange(&env, 5, Duration::from_millis(600), || Ok([0; ID_LEN])).is_err()
        });
        let deadline = Instant::now() + Duration::from_millis(300);
        let e = Rendezvous::serve(listener, 3, 5, deadline, || Ok([1; ID_LEN]))
            .err()
            .unwrap();
        assert!(e.to_string().contains("only 2 of 3 ranks joined"), "{e}");
        // Rank 1 never got the id.
        assert!(client.join().unwrap());
    }

    #[test]
    fn a_different_plan_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::thread::spawn(move || {
            let env = GroupEnv {
                rank: 1,
                world: 2,
                local_rank: 1,
                master_addr: "127.0.0.1".into(),
                master_port: port,
            };
            Rendezvous::exchange(&env, 1, Duration::from_secs(5), || Ok([0; ID_LEN])).is_err()
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let e = Rendezvous::serve(listener, 2, 2, deadline, || Ok([0; ID_LEN]))
            .err()
            .unwrap();
        assert!(e.to_string().contains("runs another job"), "{e}");
        assert!(client.join().unwrap());
    }
}
