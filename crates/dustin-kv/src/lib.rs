#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};
use dustin_core::{CoreError, KvStore, KvView, Result};

/// Shape of a KV cache, used to size it and to estimate its memory before allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Number of sequences.
    pub batch: usize,
    /// Number of layers.
    pub layers: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// Capacity per sequence, in tokens.
    pub capacity: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl KvShape {
    /// Bytes the cache takes at `dtype_bytes` bytes per element (K and V, all layers).
    pub fn bytes(&self, dtype_bytes: usize) -> u128 {
        2u128
            * self.batch as u128
            * self.layers as u128
            * self.kv_heads as u128
            * self.capacity as u128
            * self.head_dim as u128
            * dtype_bytes as u128
    }
}

/// The block size, bytes, in which a narrowed tensor stays a view of its buffer on the GPU
/// backend: burn-cubecl 0.21's `slice` copies unless the bytes it drops from the end of the
/// buffer are a multiple of the allocator's alignment, 512 on cubecl-cuda 0.10 (the CUDA
/// `KernelOps::kv_prefix` override in `dustin-kernels` says more). [`KvStore::retain`]
/// compacts a cache in place where one sequence's row of a layer (`kv_heads * capacity *
/// head_dim` elements) is a multiple of it, and rebuilds the layers otherwise.
pub const VIEW_ALIGN_BYTES: usize = 512;

/// A dense, preallocated KV cache with ragged per-sequence lengths.
///
/// Cloning is cheap (tensors are reference-counted) and safe: a later append to either copy
/// leaves the other unchanged (copy on write).
#[derive(Debug, Clone)]
pub struct DenseKvCache<B: Backend> {
    k: Vec<Option<Tensor<B, 4>>>,
    v: Vec<Option<Tensor<B, 4>>>,
    lens: Vec<usize>,
    shape: KvShape,
    device: B::Device,
    /// `Some` for one row of a batch cache ([`DenseKvCache::into_row`]): the tensors are the
    /// batch's, `lens` and `shape` the row's.
    row: Option<row::Row>,
}

mod row;

impl<B: Backend> DenseKvCache<B> {
    /// Checks that `copies` caches of `shape` fit in the memory available on `device`
    /// ([`dustin_core::memory`]): the figure needed is `copies * shape.bytes(float bytes)`.
    ///
    /// # Errors
    /// [`CoreError::OutOfMemory`] naming the shape, the bytes needed and available.
    pub fn check_memory(shape: KvShape, copies: usize, device: &B::Device) -> Result<()> {
        let needed = shape
            .bytes(dustin_core::memory::float_bytes::<B>())
            .saturating_mul(copies as u128);
        dustin_core::memory::check_alloc::<B>(
            &format!(
                "KV cache (batch {} x {} tokens x {} layers x {} KV heads x head_dim {}, K and V{})",
                shape.batch,
                shape.capacity,
                shape.layers,
                shape.kv_heads,
                shape.head_dim,
                if copies > 1 {
                    format!(", {copies} copies")
                } else {
                    String::new()
                }
            ),
            needed,
            device,
        )
    }

    /// [`DenseKvCache::new`] after [`DenseKvCache::check_memory`]: fails with the figures
    /// instead of an out-of-memory abort.
    ///
    /// # Errors
    /// [`CoreError::OutOfMemory`].
    pub fn try_new(shape: KvShape, device: &B::Device) -> Result<Self> {
        Self::check_memory(shape, 1, device)?;
        Ok(Self::new(shape, device))
    }

    /// Allocates a zeroed cache of `shape` on `device` (unchecked: see
    /// [`DenseKvCache::try_new`]), each layer's K and V in a persistent device buffer of its
    /// own ([`dustin_core::memory::persistent`]).
    pub fn new(shape: KvShape, device: &B::Device) -> Self {
        let dims = [shape.batch, shape.kv_heads, shape.capacity, shape.head_dim];
        // each layer's K and V in an exact-size buffer of their own, not in a pool's page
        let (k, v) = dustin_core::memory::persistent::<B, _, _>(device, (), |()| {
            let zeros = || {
                (0..shape.layers)
                    .map(|_| Some(Tensor::zeros(dims, device)))
                    .collect::<Vec<_>>()
            };
            (zeros(), zeros())
        });
        Self {
            k,
            v,
            lens: vec![0; shape.batch],
            shape,
            device: device.clone(),
            row: None,
        }
    }

    /// A cache from per-layer tensors (for example random contents for a benchmark, or a
    /// cache restored from elsewhere): `k[l]`, `v[l]` each `[batch, kv_heads, capacity,
    /// head_dim]`, the same for every layer, and each sequence's length.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming `k` / `v` for no layers or layers of different
    /// shapes, naming `lens` for a wrong count or a length over the capacity.
    pub fn from_layers(k: Vec<Tensor<B, 4>>, v: Vec<Tensor<B, 4>>, lens: &[usize]) -> Result<Self> {
        let first = k
            .first()
            .ok_or_else(|| CoreError::invalid("k", "at least one layer", "none"))?;
        let dims = first.dims();
        let device = first.device();
        if v.len() != k.len() {
            return Err(CoreError::invalid(
                "v",
                format!("{} layers, as k", k.len()),
                v.len(),
            ));
        }
        for (name, t) in k.iter().map(|t| ("k", t)).chain(v.iter().map(|t| ("v", t))) {
            if t.dims() != dims {
                return Err(CoreError::invalid(
                    name,
                    format!("every layer of shape {dims:?}"),
                    format!("{:?}", t.dims()),
                ));
            }
        }
        let [batch, kv_heads, capacity, head_dim] = dims;
        let shape = KvShape {
            batch,
            layers: k.len(),
            kv_heads,
            capacity,
            head_dim,
        };
        let mut cache = Self {
            k: k.into_iter().map(Some).collect(),
            v: v.into_iter().map(Some).collect(),
            lens: vec![0; batch],
            shape,
            device,
            row: None,
        };
        cache.set_lens(lens)?;
        Ok(cache)
    }

    /// The cache's shape (batch is the current number of sequences).
    pub fn shape(&self) -> KvShape {
        self.shape
    }

    /// A cache holding only the first `layers` layers of this one (for an early-exit
    /// self-draft, whose KV entries equal the target's for those layers).
    pub fn first_layers(&self, layers: usize) -> Self {
        let layers = layers.min(self.shape.layers);
        Self {
            k: self.k[..layers].to_vec(),
            v: self.v[..layers].to_vec(),
            lens: self.lens.clone(),
            shape: KvShape {
                layers,
                ..self.shape
            },
            device: self.device.clone(),
            row: self.row.clone(),
        }
    }

    /// Concatenates caches of equal layers / heads / capacity along the batch.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] when the list is empty or the shapes differ.
    pub fn stack(parts: Vec<Self>) -> Result<Self> {
        for p in &parts {
            p.whole("parts")?;
        }
        let first = parts
            .first()
            .ok_or_else(|| CoreError::invalid("parts", "at least one cache", "none"))?;
        let mut shape = first.shape;
        let device = first.device.clone();
        for p in &parts {
            let s = p.shape;
            if (s.layers, s.kv_heads, s.capacity, s.head_dim)
                != (shape.layers, shape.kv_heads, shape.capacity, shape.head_dim)
            {
                return Err(CoreError::invalid(
                    "parts",
                    format!("caches of shape {shape:?} (except batch)"),
                    format!("{s:?}"),
                ));
            }
        }
        shape.batch = parts.iter().map(|p| p.shape.batch).sum();
        let lens = parts.iter().flat_map(|p| p.lens.iter().copied()).collect();
        let mut k = Vec::with_capacity(shape.layers);
        let mut v = Vec::with_capacity(shape.layers);
        let mut parts = parts;
        for l in 0..shape.layers {
            let ks: Vec<_> = parts.iter_mut().filter_map(|p| p.k[l].take()).collect();
            let vs: Vec<_> = parts.iter_mut().filter_map(|p| p.v[l].take()).collect();
            k.push(Some(Tensor::cat(ks, 0)));
            v.push(Some(Tensor::cat(vs, 0)));
        }
        Ok(Self {
            k,
            v,
            lens,
            shape,
            device,
            row: None,
        })
    }

    /// Sequence `seq` of this cache as a batch-1 cache (its K/V over the whole capacity, and
    /// its length): views of this cache's layers where the backend makes one, so the first
    /// write into a layer copies that layer (one sequence's worth), and this cache is not
    /// written.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] for `seq` outside the batch; [`CoreError::Model`] for a
    /// layer lost to a failed write.
    pub fn sequence(&self, seq: usize) -> Result<Self> {
        self.whole("cache")?;
        let s = self.shape;
        if seq >= s.batch {
            return Err(CoreError::invalid(
                "seq",
                format!("a sequence index below {}", s.batch),
                seq,
            ));
        }
        let ranges = [seq..seq + 1, 0..s.kv_heads, 0..s.capacity, 0..s.head_dim];
        let row = |t: &Option<Tensor<B, 4>>| {
            t.as_ref()
                .map(|t| Some(t.clone().slice(ranges.clone())))
                .ok_or_else(|| CoreError::Model("KV cache layer poisoned".into()))
        };
        Ok(Self {
            k: self.k.iter().map(row).collect::<Result<_>>()?,
            v: self.v.iter().map(row).collect::<Result<_>>()?,
            lens: vec![self.lens[seq]],
            shape: KvShape { batch: 1, ..s },
            device: self.device.clone(),
            row: None,
        })
    }

    /// Writes the batch-1 cache `part` into sequence `seq` of this cache (its K/V over the
    /// whole capacity, and its length), consuming it. The layers are written in place where
    /// the backend can (this cache's tensors not shared), so a batch can be filled one
    /// sequence at a time with one sequence's cache alive beside it, instead of the two full
    /// copies of [`DenseKvCache::stack`].
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] for `seq` outside the batch, a `part` of batch other than 1
    /// or of other layers / heads / capacity / head width.
    pub fn write_sequence(&mut self, seq: usize, part: Self) -> Result<()> {
        self.whole("cache")?;
        part.whole("part")?;
        let (s, p) = (self.shape, part.shape);
        if seq >= s.batch {
            return Err(CoreError::invalid(
                "seq",
                format!("a sequence index below {}", s.batch),
                seq,
            ));
        }
        if p.batch != 1
            || (p.layers, p.kv_heads, p.capacity, p.head_dim)
                != (s.layers, s.kv_heads, s.capacity, s.head_dim)
        {
            return Err(CoreError::invalid(
                "part",
                format!("a batch-1 cache of shape {s:?} (except batch)"),
                format!("{p:?}"),
            ));
        }
        let ranges = [seq..seq + 1, 0..s.kv_heads, 0..s.capacity, 0..s.head_dim];
        let mut part = part;
        for l in 0..s.layers {
            for (dst, src) in [
                (&mut self.k[l], &mut part.k[l]),
                (&mut self.v[l], &mut part.v[l]),
            ] {
                if let (Some(d), Some(x)) = (dst.take(), src.take()) {
                    *dst = Some(d.slice_assign(ranges.clone(), x));
                }
            }
        }
        self.lens[seq] = part.lens[0];
        Ok(())
    }

    /// Sets every sequence's length (for example after a prefill written elsewhere).
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] for a wrong count or a length over the capacity.
    pub fn set_lens(&mut self, lens: &[usize]) -> Result<()> {
        if lens.len() != self.shape.batch {
            return Err(CoreError::invalid(
                "lens",
                format!("{} lengths", self.shape.batch),
                lens.len(),
            ));
        }
        if let Some((seq, &l)) = lens
            .iter()
            .enumerate()
            .find(|(_, &l)| l > self.shape.capacity)
        {
            return Err(CoreError::CacheFull {
                seq,
                needed: l,
                capacity: self.shape.capacity,
            });
        }
        self.lens.copy_from_slice(lens);
        Ok(())
    }

    fn check_layer(&self, layer: usize) -> Result<()> {
        if layer >= self.shape.layers {
            return Err(CoreError::invalid(
                "layer",
                format!("< {}", self.shape.layers),
                layer,
            ));
        }
        Ok(())
    }

    /// As [`KvStore::append`], writing the keys and then the values with `write(dst, src,
    /// lens)` (`dst` the layer's whole cache `[batch, kv_heads, capacity, head_dim]`, `src`
    /// `[batch, kv_heads, n, head_dim]`, `lens` each sequence's cached length, where its rows
    /// go) instead of Burn's slice-assigns: for example a backend's one-launch cache write
    /// for a ragged batch (`dustin_kernels::KernelOps::kv_write`). A row of a batch cache
    /// ([`DenseKvCache::into_row`]) does not call `write`: its keys and values go into the
    /// batch's buffers with Burn's slice-assign.
    ///
    /// # Errors
    /// As [`KvStore::append`] (checked before anything is written). An error of `write`
    /// itself is returned as is, and that layer's cache is then lost (later reads of it fail
    /// with [`CoreError::Model`]); `write` should only fail where `append`'s own checks would.
    pub fn append_with(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        write: impl Fn(Tensor<B, 4>, Tensor<B, 4>, &[usize]) -> Result<Tensor<B, 4>>,
    ) -> Result<()> {
        self.check_append(layer, &k, &v)?;
        if self.row.is_some() {
            return self.append_row(layer, k, v);
        }
        let kd = self.k[layer]
            .take()
            .ok_or_else(|| CoreError::Model("KV cache layer poisoned".into()))?;
        self.k[layer] = Some(write(kd, k, &self.lens)?);
        let vd = self.v[layer]
            .take()
            .ok_or_else(|| CoreError::Model("KV cache layer poisoned".into()))?;
        self.v[layer] = Some(write(vd, v, &self.lens)?);
        Ok(())
    }

    /// As [`DenseKvCache::append_with`], with one `write(k_dst, v_dst, k, v, lens)` for the
    /// keys and the values together, returning the updated `(k_dst, v_dst)`: for a backend's
    /// one-launch write of both (`dustin_kernels::KernelOps::kv_write_pair`).
    /// A row of a batch cache does not call `write`, as in [`DenseKvCache::append_with`].
    ///
    /// # Errors
    /// As [`KvStore::append`] (checked before anything is written). An error of `write`
    /// itself is returned as is, and that layer's cache is then lost (later reads of it fail
    /// with [`CoreError::Model`]); `write` should only fail where `append`'s own checks would.
    #[allow(clippy::type_complexity)]
    pub fn append_pair_with(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        write: impl Fn(
            Tensor<B, 4>,
            Tensor<B, 4>,
            Tensor<B, 4>,
            Tensor<B, 4>,
            &[usize],
        ) -> Result<(Tensor<B, 4>, Tensor<B, 4>)>,
    ) -> Result<()> {
        self.check_append(layer, &k, &v)?;
        if self.row.is_some() {
            return self.append_row(layer, k, v);
        }
        let poisoned = || CoreError::Model("KV cache layer poisoned".into());
        let kd = self.k[layer].take().ok_or_else(poisoned)?;
        let vd = match self.v[layer].take() {
            Some(t) => t,
            None => {
                self.k[layer] = Some(kd);
                return Err(poisoned());
            }
        };
        let (kd, vd) = write(kd, vd, k, v, &self.lens)?;
        self.k[layer] = Some(kd);
        self.v[layer] = Some(vd);
        Ok(())
    }

    /// The checks of [`KvStore::append`]: the layer, `k` and `v` `[batch, kv_heads, n,
    /// head_dim]`, room for `n` more positions in every sequence.
    fn check_append(&self, layer: usize, k: &Tensor<B, 4>, v: &Tensor<B, 4>) -> Result<()> {
        self.check_layer(layer)?;
        let [b, h, n, d] = k.dims();
        let expected = [
            self.shape.batch,
            self.shape.kv_heads,
            n,
            self.shape.head_dim,
        ];
        for (name, dims) in [("k", [b, h, n, d]), ("v", v.dims())] {
            if dims != expected {
                return Err(CoreError::Shape {
                    name: name.into(),
                    expected: expected.to_vec(),
                    found: dims.to_vec(),
                });
            }
        }
        self.check_room(n)
    }

    /// `n` more positions fit every sequence.
    ///
    /// # Errors
    /// [`CoreError::CacheFull`] naming the first sequence they do not fit.
    fn check_room(&self, n: usize) -> Result<()> {
        if let Some((seq, &l)) = self
            .lens
            .iter()
            .enumerate()
            .find(|(_, &l)| l + n > self.shape.capacity)
        {
            return Err(CoreError::CacheFull {
                seq,
                needed: l + n,
                capacity: self.shape.capacity,
            });
        }
        Ok(())
    }

    /// [`KvStore::retain`] in place: row `keep[j]` moves to row `j`. From the first `j` whose
    /// row moves every later one moves too (`keep` ascends), so the moved rows land in one
    /// range `j0..kept`: they are gathered (a temporary of those rows of one layer at a time),
    /// written over that range, and the layer narrowed to the kept rows, a view of the same
    /// buffer. No layer is reallocated: rebuilding held each layer twice for a moment (and,
    /// before each old layer was handed back at once, two whole caches, which at Qwen2.5-72B's
    /// shapes, 32k, batch 8 ran an H100 out of memory). The rows of finished sequences stay
    /// reserved until the cache is dropped; a joining sequence's `stack` makes exact-size
    /// layers again. A layer shared with another cache (copy on write) is copied by the write
    /// instead, as any write to it is. The caller sets the lengths and the batch.
    ///
    /// # Errors
    /// [`CoreError::Model`] when the device reports an error at the synchronisation that hands
    /// the gathered rows back ([`dustin_core::memory::release_freed`]).
    fn compact(&mut self, keep: &[usize]) -> Result<()> {
        let (s, kept) = (self.shape, keep.len());
        let j0 = keep
            .iter()
            .enumerate()
            .position(|(j, &i)| i != j)
            .unwrap_or(kept);
        let moved = (j0 < kept).then(|| {
            let idx: Vec<i64> = keep[j0..].iter().map(|&i| i as i64).collect();
            Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [kept - j0]), &self.device)
        });
        let rest = [0..s.kv_heads, 0..s.capacity, 0..s.head_dim];
        for slot in self.k.iter_mut().chain(self.v.iter_mut()) {
            if let Some(t) = slot.take() {
                let [h, c, d] = rest.clone();
                let t = match &moved {
                    Some(idx) => {
                        let rows = t.clone().select(0, idx.clone());
                        t.slice_assign([j0..kept, h.clone(), c.clone(), d.clone()], rows)
                    }
                    None => t,
                };
                *slot = Some(t.slice([0..kept, h, c, d]));
            }
        }
        // the gathered rows' temporaries, of a size decoding does not ask for
        dustin_core::memory::release_freed::<B>(&self.device)
    }

    /// [`KvStore::retain`] by rebuilding each layer at the kept rows, for shapes whose rows do
    /// not fill whole [`VIEW_ALIGN_BYTES`] blocks (the narrowed layer would be a copy there):
    /// layer by layer, the new layers in exact-size buffers as `new` makes them, each old layer
    /// handed back to the device as soon as its successor is made, so the cache and one layer
    /// are alive together, not two caches. The caller sets the lengths and the batch.
    ///
    /// # Errors
    /// [`CoreError::Model`] when the device reports an error at a synchronisation
    /// ([`dustin_core::memory::release_freed`]); the cache is whole either way.
    fn rebuild(&mut self, keep: &[usize]) -> Result<()> {
        let idx: Vec<i64> = keep.iter().map(|&i| i as i64).collect();
        let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [keep.len()]), &self.device);
        let mut err = None;
        for slot in self.k.iter_mut().chain(self.v.iter_mut()) {
            if let Some(t) = slot.take() {
                *slot = Some(dustin_core::memory::persistent::<B, _, _>(
                    &self.device,
                    t,
                    |t| t.select(0, idx.clone()),
                ));
                if let Err(e) = dustin_core::memory::release_freed::<B>(&self.device) {
                    err.get_or_insert(e);
                }
            }
        }
        err.map_or(Ok(()), Err)
    }

    /// Burn's slice-assigns: one for equal lengths, one per sequence otherwise.
    fn write(dst: Tensor<B, 4>, src: Tensor<B, 4>, lens: &[usize]) -> Tensor<B, 4> {
        let [_, h, _, d] = dst.dims();
        let n = src.dims()[2];
        let uniform = lens.windows(2).all(|w| w[0] == w[1]);
        if uniform {
            let start = lens.first().copied().unwrap_or(0);
            return dst.slice_assign([0..lens.len(), 0..h, start..start + n, 0..d], src);
        }
        let mut dst = dst;
        for (b, &start) in lens.iter().enumerate() {
            let row = src.clone().slice([b..b + 1, 0..h, 0..n, 0..d]);
            dst = dst.slice_assign([b..b + 1, 0..h, start..start + n, 0..d], row);
        }
        dst
    }
}

impl<B: Backend> KvStore<B> for DenseKvCache<B> {
    fn batch(&self) -> usize {
        self.shape.batch
    }

    fn num_layers(&self) -> usize {
        self.shape.layers
    }

    fn lens(&self) -> &[usize] {
        &self.lens
    }

    fn capacity(&self) -> usize {
        self.shape.capacity
    }

    fn append(&mut self, layer: usize, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Result<()> {
        self.append_with(layer, k, v, |dst, src, lens| {
            Ok(Self::write(dst, src, lens))
        })
    }

    fn advance(&mut self, n: usize) -> Result<()> {
        self.check_room(n)?;
        self.lens.iter_mut().for_each(|l| *l += n);
        Ok(())
    }

    fn truncate(&mut self, seq: usize, len: usize) -> Result<()> {
        let cur = *self
            .lens
            .get(seq)
            .ok_or_else(|| CoreError::invalid("seq", format!("< {}", self.shape.batch), seq))?;
        if len > cur {
            return Err(CoreError::invalid(
                "len",
                format!("<= current length {cur} of sequence {seq}"),
                len,
            ));
        }
        self.lens[seq] = len;
        Ok(())
    }

    fn retain(&mut self, keep: &[usize]) -> Result<()> {
        self.whole("cache")?;
        if keep.windows(2).any(|w| w[0] >= w[1]) {
            return Err(CoreError::invalid(
                "keep",
                "ascending unique indices",
                format!("{keep:?}"),
            ));
        }
        if let Some(&bad) = keep.iter().find(|&&i| i >= self.shape.batch) {
            return Err(CoreError::invalid(
                "keep",
                format!("indices < {}", self.shape.batch),
                bad,
            ));
        }
        if keep.len() == self.shape.batch {
            return Ok(());
        }
        if keep.is_empty() {
            let empty = KvShape {
                batch: 0,
                ..self.shape
            };
            *self = Self::new(empty, &self.device.clone());
            return Ok(());
        }
        let (s, kept) = (self.shape, keep.len());
        let row_bytes =
            s.kv_heads * s.capacity * s.head_dim * dustin_core::memory::float_bytes::<B>();
        let res = if row_bytes.is_multiple_of(VIEW_ALIGN_BYTES) {
            self.compact(keep)
        } else {
            self.rebuild(keep)
        };
        self.lens = keep.iter().map(|&i| self.lens[i]).collect();
        self.shape.batch = kept;
        // the cache is whole either way; a failed synchronisation is the device's error
        res
    }

    fn view(&self, layer: usize, len: usize) -> KvView<B> {
        let s = self.shape;
        let len = len.min(s.capacity);
        // the row's own rows of the batch's tensors, else the whole batch
        let rows = self.row.as_ref().map_or(0..s.batch, |r| r.seq..r.seq + 1);
        let take = |t: &Option<Tensor<B, 4>>| {
            t.as_ref()
                .map(|t| {
                    t.clone()
                        .slice([rows.clone(), 0..s.kv_heads, 0..len, 0..s.head_dim])
                })
                .unwrap_or_else(|| {
                    Tensor::zeros([s.batch, s.kv_heads, len, s.head_dim], &self.device)
                })
        };
        KvView {
            k: take(&self.k[layer.min(s.layers.saturating_sub(1))]),
            v: take(&self.v[layer.min(s.layers.saturating_sub(1))]),
        }
    }
}
