//! [`JoinDrafter`] for [`ModelDrafter`]: joining sequences prefilled on their own, then
//! stacked after the batch's rows.

use dustin_core::{DenseHook, TokenId};
use dustin_kernels::KernelOps;

use super::ModelDrafter;
use crate::join::{find_row, stack_row, JoinDrafter, RowPrefill};

impl<B: KernelOps> JoinDrafter<B> for ModelDrafter<B> {
    fn begin_row(
        &mut self,
        seq: usize,
        prompt: &[TokenId],
        room: usize,
    ) -> dustin_core::Result<()> {
        if self.draft_keep.is_some() || self.target_kv.is_some() {
            return Err(dustin_core::CoreError::invalid(
                "drafter",
                "a draft with its own dense cache (no draft selection rule, not on the target's cache) to take joining sequences",
                "a draft selection rule or the target's cache",
            ));
        }
        if self.joining.iter().any(|r| r.seq == seq) {
            return Err(dustin_core::CoreError::invalid(
                "seq",
                "an id not already joining",
                seq,
            ));
        }
        let capacity = (prompt.len() + room).max(self.cache.as_ref().map_or(0, |c| {
            use dustin_core::KvStore;
            c.capacity()
        }));
        let row = RowPrefill::new(&self.model, seq, prompt, capacity, self.layers, DenseHook)?;
        self.joining.push(row);
        Ok(())
    }

    fn prefill_row(&mut self, seq: usize, end: usize) -> dustin_core::Result<()> {
        let i = find_row(&self.joining, seq)?;
        let model = self.model.clone();
        self.joining[i].run(&model, end, self.layers)?;
        Ok(())
    }

    fn join_row(&mut self, seq: usize, first: TokenId) -> dustin_core::Result<()> {
        let i = find_row(&self.joining, seq)?;
        if !self.joining[i].finished() {
            return Err(dustin_core::CoreError::invalid(
                "seq",
                "a sequence whose prompt is prefilled",
                seq,
            ));
        }
        let row = self.joining.remove(i);
        self.cache = Some(stack_row(self.cache.take(), row.cache)?);
        self.pending.push(vec![first]);
        self.base.push(0);
        self.fed.push(0);
        self.last.push(Vec::new());
        self.last_selection.clear();
        Ok(())
    }

    fn drop_row(&mut self, seq: usize) {
        self.joining.retain(|r| r.seq != seq);
    }

    fn clear_batch(&mut self) {
        self.cache = None;
        self.pending.clear();
        self.base.clear();
        self.fed.clear();
        self.last.clear();
        self.scores = None;
        self.last_selection.clear();
    }
}
