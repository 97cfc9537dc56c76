//! Tensor parallelism: one model split across the devices of a group, Megatron-LM style
//! (Shoeybi et al. 2019, "Megatron-LM", section 3: column-parallel then row-parallel linear
//! layers, one all-reduce per attention block and one per MLP block).
//!
//! Rank `r` of a group of `world` devices holds, of every decoder layer:
//! - the query heads `r * H/world .. (r+1) * H/world` and the KV heads
//!   `r * KV/world .. (r+1) * KV/world` (a contiguous block of GQA groups, so every query
//!   head sits with its KV head): the columns of `q`, `k`, `v` (and their biases) and the rows
//!   of `o` that belong to them;
//! - the columns `r * I/world ..` of `gate` and `up` and the same rows of `down`
//!   (`I` = `intermediate_size`);
//! - a full copy of the norms, the embedding, the LM head and the RoPE tables.
//!
//! Its KV cache holds only its KV heads (`[batch, kv_heads / world, capacity, head_dim]` per
//! layer), and every selector and estimator hook on the rank sees only its heads: the
//! selection is split with the cache. After `o` and after `down`, each rank holds a partial
//! sum of the block's output; [`TpGroup::sum`] adds them up (NCCL's all-reduce on CUDA
//! through Burn 0.21's `DistributedBackend`, [`KernelOps::all_reduce_sum`](dustin_kernels::CollectiveOps::all_reduce_sum)), so every rank
//! continues with the same hidden states and computes the same logits.
//!
//! Ranks run SPMD: one host thread per rank runs the same engine (draft included, replicated)
//! on its own shard and cache; every rank must make the same forward calls in the same
//! order, which holds since they see the same tokens and the same logits.
//!
//! Backends without a device collective (the CPU backend), or a group that lists one device
//! more than once, sum on the host: each rank reads its partial sum back, the last to arrive
//! adds the ranks' parts in rank order, and every rank uploads the total. That path is for
//! tests and small checks; it is not a transport for real multi-GPU runs.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use burn_tensor::{backend::Backend, DType, Tensor, TensorData};
use dustin_kernels::KernelOps;

use crate::error::{QwenError, Result};

/// How long a rank waits for the others at a host-side sum before it gives up (a rank that
/// failed or diverged would otherwise leave the rest waiting forever), seconds.
pub const HOST_SUM_TIMEOUT_SECS: u64 = 600;

/// A tensor-parallel group: its devices in rank order and the all-reduce between them.
/// Shared (`Arc`) by the ranks' model shards.
#[derive(Debug)]
pub struct TpGroup<B: Backend> {
    devices: Vec<B::Device>,
    host: HostSum,
    /// Sum on the host even where the backend has a device collective (a check of the
    /// collective against the host path).
    force_host: bool,
}

impl<B: Backend> TpGroup<B> {
    /// A group over `devices` (rank `r` runs on `devices[r]`).
    ///
    /// # Errors
    /// [`QwenError::Parallel`] for an empty list.
    pub fn new(devices: Vec<B::Device>) -> Result<Arc<Self>> {
        Self::build(devices, false)
    }

    /// As [`TpGroup::new`], summing on the host whatever the backend (to check the device
    /// collective against it).
    ///
    /// # Errors
    /// As [`TpGroup::new`].
    pub fn new_host_sum(devices: Vec<B::Device>) -> Result<Arc<Self>> {
        Self::build(devices, true)
    }

    fn build(devices: Vec<B::Device>, force_host: bool) -> Result<Arc<Self>> {
        if devices.is_empty() {
            return Err(QwenError::Parallel(
                "tensor-parallel group of no devices: expected at least one".into(),
            ));
        }
        let world = devices.len();
        Ok(Arc::new(Self {
            devices,
            host: HostSum::new(world),
            force_host,
        }))
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.devices.len()
    }

    /// The devices in rank order.
    pub fn devices(&self) -> &[B::Device] {
        &self.devices
    }

    /// Whether the group sums through the backend's device collective (every device distinct
    /// and the backend has one) rather than on the host.
    pub fn on_device(&self) -> bool
    where
        B: KernelOps,
    {
        B::COLLECTIVE
            && !self.force_host
            && self.devices.len() > 1
            && self
                .devices
                .iter()
                .enumerate()
                .all(|(i, d)| !self.devices[..i].contains(d))
    }

    /// All-reduce (sum) of `x` `[batch, n, hidden]` over the group, called by rank `rank`;
    /// every rank gets the same total, in `x`'s dtype. A group of one returns `x`.
    ///
    /// # Errors
    /// [`QwenError::Parallel`] for a rank outside the group, when the other ranks do not
    /// arrive within [`HOST_SUM_TIMEOUT_SECS`] (host path) or send a different shape;
    /// [`QwenError::Kernel`] from the device collective.
    pub fn sum(&self, rank: usize, x: Tensor<B, 3>) -> Result<Tensor<B, 3>>
    where
        B: KernelOps,
    {
        if rank >= self.world() {
            return Err(QwenError::Parallel(format!(
                "rank {rank} of a group of {}",
                self.world()
            )));
        }
        if self.world() == 1 {
            return Ok(x);
        }
        if self.on_device() {
            return Ok(B::all_reduce_sum(x, &self.devices)?);
        }
        let dims = x.dims();
        let dtype = x.dtype();
        let device = x.device();
        let part: Vec<f32> = x
            .into_data()
            .convert::<f32>()
            .into_vec()
            .map_err(|e| QwenError::Parallel(format!("rank {rank}: read back: {e:?}")))?;
        let total = self.host.sum(rank, part)?;
        let data = TensorData::new(total.as_ref().clone(), dims);
        let data = if dtype == DType::F32 {
            data
        } else {
            data.convert_dtype(dtype)
        };
        Ok(Tensor::from_data(data, &device))
    }
}

/// One rank's place in a group, held by its model shard.
#[derive(Debug, Clone)]
pub struct TpRank<B: Backend> {
    /// This rank, `0 .. group.world()`.
    pub rank: usize,
    /// The group.
    pub group: Arc<TpGroup<B>>,
}

impl<B: Backend> TpRank<B> {
    /// Rank `rank` of `group`.
    ///
    /// # Errors
    /// [`QwenError::Parallel`] for a rank outside the group.
    pub fn new(rank: usize, group: Arc<TpGroup<B>>) -> Result<Self> {
        if rank >= group.world() {
            return Err(QwenError::Parallel(format!(
                "rank {rank} of a group of {}: expected 0 ..= {}",
                group.world(),
                group.world() - 1
            )));
        }
        Ok(Self { rank, group })
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.group.world()
    }

    /// This rank's device.
    pub fn device(&self) -> &B::Device {
        &self.group.devices[self.rank]
    }

    /// The block `rank * len / world .. (rank + 1) * len / world` of a dimension of size
    /// `len` (checked divisible by [`check_divisible`]).
    pub fn part(&self, len: usize) -> std::ops::Range<usize> {
        let w = len / self.world();
        self.rank * w..(self.rank + 1) * w
    }
}

/// Checks that a dimension splits evenly over `world` ranks.
///
/// # Errors
/// [`QwenError::Parallel`] naming the config key, its value and the world size.
pub fn check_divisible(key: &str, value: usize, world: usize) -> Result<()> {
    if world == 0 || !value.is_multiple_of(world) {
        return Err(QwenError::Parallel(format!(
            "`{key}` = {value} does not split over {world} ranks: tensor parallelism needs a \
             multiple of the world size"
        )));
    }
    Ok(())
}

fn poisoned<T>(_: T) -> QwenError {
    QwenError::Parallel("host all-reduce: a rank panicked".into())
}

/// Host-side sum of equal-length `f32` vectors over `world` ranks (a reusable rendezvous).
#[derive(Debug)]
struct HostSum {
    world: usize,
    state: Mutex<HostState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct HostState {
    /// Incremented when every rank has taken the round's total.
    round: u64,
    parts: Vec<Option<Vec<f32>>>,
    arrived: usize,
    total: Option<Arc<Vec<f32>>>,
    taken: usize,
}

impl HostSum {
    fn new(world: usize) -> Self {
        Self {
            world,
            state: Mutex::new(HostState {
                parts: vec![None; world],
                ..HostState::default()
            }),
            cv: Condvar::new(),
        }
    }

    fn sum(&self, rank: usize, part: Vec<f32>) -> Result<Arc<Vec<f32>>> {
        let timeout = Duration::from_secs(HOST_SUM_TIMEOUT_SECS);
        let mut st = self.state.lock().map_err(poisoned)?;
        // a rank that comes back before the last round's total was taken by all waits
        let (guard, res) = self
            .cv
            .wait_timeout_while(st, timeout, |s| {
                s.total.is_some() || s.parts[rank].is_some()
            })
            .map_err(poisoned)?;
        st = guard;
        if res.timed_out() {
            return Err(QwenError::Parallel(format!(
                "host all-reduce: rank {rank} waited {HOST_SUM_TIMEOUT_SECS} s for the last round to drain"
            )));
        }
        let round = st.round;
        st.parts[rank] = Some(part);
        st.arrived += 1;
        if st.arrived == self.world {
            let parts: Vec<Vec<f32>> = st.parts.iter_mut().filter_map(Option::take).collect();
            let len = parts[0].len();
            if let Some(bad) = parts.iter().position(|p| p.len() != len) {
                st.arrived = 0;
                st.round += 1;
                self.cv.notify_all();
                return Err(QwenError::Parallel(format!(
                    "host all-reduce: rank {bad} sent {} values where rank 0 sent {len}",
                    parts[bad].len()
                )));
            }
            let mut total = vec![0f32; len];
            for p in &parts {
                for (t, v) in total.iter_mut().zip(p) {
                    *t += v;
                }
            }
            st.total = Some(Arc::new(total));
            st.taken = 0;
            self.cv.notify_all();
        } else {
            let (guard, res) = self
                .cv
                .wait_timeout_while(st, timeout, |s| s.round == round && s.total.is_none())
                .map_err(poisoned)?;
            st = guard;
            if res.timed_out() {
                return Err(QwenError::Parallel(format!(
                    "host all-reduce: rank {rank} waited {HOST_SUM_TIMEOUT_SECS} s for the other ranks"
                )));
            }
        }
        let total = match (&st.total, st.round == round) {
            (Some(t), true) => t.clone(),
            _ => {
                return Err(QwenError::Parallel(format!(
                    "host all-reduce: round {round} failed on another rank"
                )))
            }
        };
        st.taken += 1;
        if st.taken == self.world {
            st.total = None;
            st.arrived = 0;
            st.taken = 0;
            st.round += 1;
            self.cv.notify_all();
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_sum_adds_in_rank_order_over_many_rounds() {
        let hs = Arc::new(HostSum::new(3));
        let out: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let hands: Vec<_> = (0..3)
                .map(|r| {
                    let hs = hs.clone();
                    s.spawn(move || {
                        (0..50)
                            .map(|round| {
                                let v = vec![(r * 100 + round) as f32, 1.0];
                                hs.sum(r, v).map(|t| t.as_ref().clone())
                            })
                            .collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            hands
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        for rank_out in &out {
            for (round, t) in rank_out.iter().enumerate() {
                // 0 + 100 + 200 + 3 * round, and 3 ranks of 1
                assert_eq!(t, &vec![(300 + 3 * round) as f32, 3.0]);
            }
        }
    }

    #[test]
    fn divisibility_is_named() {
        let e = check_divisible("num_key_value_heads", 2, 4).unwrap_err();
        assert!(e.to_string().contains("num_key_value_heads"), "{e}");
        assert!(check_divisible("num_key_value_heads", 8, 4).is_ok());
    }
}
