//! Process groups over c10d: rendezvous (torchrun environment or in-process threads),
//! sub-groups, and the collectives the runtime uses.

use std::env;
use std::time::Duration;

use tch::{Device, Kind, Tensor};

use super::error::DistError;
use super::ffi;

/// Which c10d backend carries the collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `ProcessGroupGloo`, CPU tensors.
    Gloo,
    /// `ProcessGroupNCCL` on CUDA device `device` (needs the `nccl` feature).
    Nccl {
        /// The CUDA device index.
        device: usize,
    },
}

impl Backend {
    /// Where tensors must live for this backend.
    pub fn device(self) -> Device {
        match self {
            Backend::Gloo => Device::Cpu,
            Backend::Nccl { device } => Device::Cuda(device),
        }
    }
}

/// Whether this build can create NCCL groups (the `nccl` feature).
pub fn nccl_compiled() -> bool {
    ffi::nccl_compiled()
}

/// How an all-reduce combines the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The largest value.
    Max,
    /// The smallest value.
    Min,
}

/// How groups are created.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// The process-group backend.
    pub backend: Backend,
    /// Every store wait and collective gives up after this long.
    pub timeout: Duration,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            backend: Backend::Gloo,
            timeout: Duration::from_secs(60),
        }
    }
}

/// One rank's handle on the rendezvous: the shared store and its place in the world.
/// Groups are created from it; every member of a group must create it.
pub struct Rendezvous {
    store: ffi::Store,
    rank: usize,
    world_size: usize,
    /// Address the gloo device binds to (empty: gloo's default for this host).
    hostname: String,
    opts: GroupOptions,
}

fn env_usize(name: &str) -> Result<usize, DistError> {
    let v = env::var(name).map_err(|_| DistError::Setup {
        message: format!("{name} is not set (start the ranks with torchrun, or set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE)"),
    })?;
    v.trim().parse().map_err(|_| DistError::Setup {
        message: format!("{name}={v:?} is not a non-negative integer"),
    })
}

fn timeout_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Rendezvous {
    /// The torchrun environment: `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`
    /// (and `LOCAL_RANK` as the CUDA device for NCCL). Under torchrun the launcher
    /// already serves the store (`TORCHELASTIC_USE_AGENT_STORE`); otherwise rank 0 does.
    pub fn from_env(mut opts: GroupOptions) -> Result<Rendezvous, DistError> {
        let addr = env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".to_owned());
        let port = env_usize("MASTER_PORT")?;
        let port = u16::try_from(port).map_err(|_| DistError::Setup {
            message: format!("MASTER_PORT={port} is not a port"),
        })?;
        let rank = env_usize("RANK")?;
        let world_size = env_usize("WORLD_SIZE")?;
        if world_size == 0 || rank >= world_size {
            return Err(DistError::Setup {
                message: format!("RANK={rank} is not below WORLD_SIZE={world_size}"),
            });
        }
        if let Backend::Nccl { .. } = opts.backend {
            let device = env::var("LOCAL_RANK")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            opts.backend = Backend::Nccl { device };
        }
        let agent = env::var("TORCHELASTIC_USE_AGENT_STORE").is_ok_and(|v| v == "True");
        let store = ffi::Store::tcp(
            &addr,
            port,
            rank == 0 && !agent,
            world_size,
            timeout_ms(opts.timeout),
        )
        .map_err(|message| DistError::Setup {
            message: format!("TCPStore at {addr}:{port}: {message}"),
        })?;
        // Keys of this library never collide with those of other users of the store.
        let store = store.prefixed("featshard").map_err(setup)?;
        let local = ["127.0.0.1", "localhost", "::1"].contains(&addr.as_str());
        Ok(Rendezvous {
            store,
            rank,
            world_size,
            hostname: if local {
                "127.0.0.1".to_owned()
            } else {
                String::new()
            },
            opts,
        })
    }

    /// `world_size` ranks in this process (one per thread) sharing a `HashStore`:
    /// move each into its own thread.
    pub fn in_process(world_size: usize, opts: GroupOptions) -> Result<Vec<Rendezvous>, DistError> {
        let store = ffi::Store::hash().map_err(setup)?;
        (0..world_size)
            .map(|rank| {
                Ok(Rendezvous {
                    store: store.share().map_err(setup)?,
                    rank,
                    world_size,
                    hostname: "127.0.0.1".to_owned(),
                    opts: opts.clone(),
                })
            })
            .collect()
    }

    /// This process's rank in the world.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many processes the world holds.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The options every group is created with.
    pub fn options(&self) -> &GroupOptions {
        &self.opts
    }

    /// The CUDA device of this rank's NCCL groups (one GPU per rank); no effect on gloo.
    pub fn set_device(&mut self, device: usize) {
        if let Backend::Nccl { .. } = self.opts.backend {
            self.opts.backend = Backend::Nccl { device };
        }
    }

    /// All ranks.
    pub fn world(&self) -> Result<ProcessGroup, DistError> {
        let all: Vec<usize> = (0..self.world_size).collect();
        self.group("world", &all)?.ok_or_else(|| DistError::Setup {
            message: "this rank is not in the world".into(),
        })
    }

    /// The group of global `ranks` (sorted, distinct) named `name`, or `None` when
    /// this rank is not a member. Only members call into c10d; `name` must be the same
    /// on every member and differ between groups.
    pub fn group(&self, name: &str, ranks: &[usize]) -> Result<Option<ProcessGroup>, DistError> {
        if ranks.windows(2).any(|w| w[0] >= w[1]) || ranks.iter().any(|&r| r >= self.world_size) {
            return Err(DistError::Setup {
                message: format!(
                    "group `{name}`: ranks {ranks:?} must be sorted, distinct and below {}",
                    self.world_size
                ),
            });
        }
        let Some(local) = ranks.iter().position(|&r| r == self.rank) else {
            return Ok(None);
        };
        let store = self.store.prefixed(name).map_err(setup)?;
        let ms = timeout_ms(self.opts.timeout);
        let inner = match self.opts.backend {
            Backend::Gloo => ffi::Group::gloo(&store, local, ranks.len(), &self.hostname, ms),
            Backend::Nccl { device } => ffi::Group::nccl(&store, local, ranks.len(), device, ms),
        }
        .map_err(|message| DistError::Collective {
            op: "create",
            group: name.to_owned(),
            message,
        })?;
        Ok(Some(ProcessGroup {
            inner,
            name: name.to_owned(),
            rank: local,
            ranks: ranks.to_vec(),
            device: self.opts.backend.device(),
        }))
    }
}

fn setup(message: String) -> DistError {
    DistError::Setup { message }
}

/// One rank's membership in a c10d process group. Collectives block until every
/// member joined or the timeout passed; members must issue them in the same order.
pub struct ProcessGroup {
    inner: ffi::Group,
    name: String,
    rank: usize,
    ranks: Vec<usize>,
    device: Device,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .finish()
    }
}

impl ProcessGroup {
    /// The group's name (its store prefix).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks the group holds.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// Global ranks of the members, in group order.
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// Where this group's tensors live.
    pub fn device(&self) -> Device {
        self.device
    }

    fn err(&self, op: &'static str) -> impl FnOnce(String) -> DistError + '_ {
        move |message| DistError::Collective {
            op,
            group: self.name.clone(),
            message,
        }
    }

    fn check_root(&self, op: &'static str, root: usize) -> Result<(), DistError> {
        if root >= self.size() {
            return Err(self.err(op)(format!(
                "root {root} is not below the group size {}",
                self.size()
            )));
        }
        Ok(())
    }

    /// `t` of the group rank `root` into `t` of every member.
    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<(), DistError> {
        self.check_root("broadcast", root)?;
        self.inner.broadcast(t, root).map_err(self.err("broadcast"))
    }

    /// Member `i` receives `inputs[i]` of `root` into `out`. `inputs` (one per member,
    /// each shaped like `out`) is read on `root` only; other members pass `None`.
    pub fn scatter(
        &self,
        out: &mut Tensor,
        inputs: Option<&[Tensor]>,
        root: usize,
    ) -> Result<(), DistError> {
        self.check_root("scatter", root)?;
        let inputs = inputs.unwrap_or(&[]);
        if self.rank == root && inputs.len() != self.size() {
            return Err(self.err("scatter")(format!(
                "{} inputs for {} members",
                inputs.len(),
                self.size()
            )));
        }
        self.inner
            .scatter(out, inputs, root)
            .map_err(self.err("scatter"))
    }

    /// Every member's `input` (all of one shape and dtype), in group order.
    pub fn all_gather(&self, input: &Tensor) -> Result<Vec<Tensor>, DistError> {
        let mut outs: Vec<Tensor> = (0..self.size()).map(|_| input.empty_like()).collect();
        self.inner
            .all_gather(&mut outs, input)
            .map_err(self.err("all_gather"))?;
        Ok(outs)
    }

    /// Reduces `t` in place over the group with `op`.
    pub fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<(), DistError> {
        let code = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
        };
        self.inner
            .all_reduce(t, code)
            .map_err(self.err("all_reduce"))
    }

    /// Waits until every rank of the group reaches it.
    pub fn barrier(&self) -> Result<(), DistError> {
        self.inner.barrier().map_err(self.err("barrier"))
    }

    /// Broadcasts bytes of unknown length from `root` (a length, then the bytes).
    pub fn broadcast_bytes(&self, bytes: Option<&[u8]>, root: usize) -> Result<Vec<u8>, DistError> {
        let mut len =
            Tensor::from_slice(&[bytes.map_or(0, |b| b.len() as i64)]).to_device(self.device);
        self.broadcast(&mut len, root)?;
        let n = len.int64_value(&[0]);
        let n = usize::try_from(n)
            .map_err(|_| self.err("broadcast")(format!("negative length {n}")))?;
        let mut buf = match bytes {
            Some(b) if self.rank == root => Tensor::from_slice(b).to_device(self.device),
            _ => Tensor::zeros([n as i64], (Kind::Uint8, self.device)),
        };
        self.broadcast(&mut buf, root)?;
        let buf = buf.to_device(Device::Cpu);
        let mut out = vec![0u8; n];
        buf.f_copy_data_u8(&mut out, n)
            .map_err(|e| self.err("broadcast")(e.to_string()))?;
        Ok(out)
    }
}
