//! `Box<H>` as an [`AttentionHook`] forwards every method to the boxed hook, the defaulted ones
//! included: a boxed hook that asks for the key mass must get it, not the trait's default
//! `false`, and what the boxed hook returns must come back unchanged.

use std::cell::RefCell;
use std::rc::Rc;

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{Int, Tensor, TensorData};
use dustin_core::{AttentionHook, CoreError, LayerAttnCtx, LayerSelection, Phase, Result};

type B = Flex;

/// One call the recorder saw: method, layer, phase, and for the tensor calls the tensor's
/// shape and the sum of its values.
#[derive(Debug, Clone, PartialEq)]
enum Call {
    OnLayer(usize, Phase),
    WantsProbs(usize, Phase),
    OnProbs(usize, Phase, Vec<usize>, f32),
    WantsKeyMass(usize, Phase),
    OnKeyMass(usize, Phase, Vec<usize>, f32),
}

const LAST_PREFILL: Phase = Phase::Prefill {
    seq: 0,
    last_chunk: true,
};

/// Wants probabilities at layer 1 of a decode step and the key mass at layer 2 of the prompt's
/// last chunk; fails at layer 9; selects positions 0, 2 and 4 at layer 3. Every call is logged.
struct Recorder {
    log: Rc<RefCell<Vec<Call>>>,
}

fn failure(layer: usize) -> Result<()> {
    if layer == 9 {
        Err(CoreError::Model(format!("layer {layer} refused")))
    } else {
        Ok(())
    }
}

fn sum<const D: usize>(t: &Tensor<B, D>) -> f32 {
    t.clone().sum().into_scalar()
}

impl AttentionHook<B> for Recorder {
    fn on_layer(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<Option<LayerSelection<B>>> {
        self.log
            .borrow_mut()
            .push(Call::OnLayer(ctx.layer, ctx.phase));
        if ctx.layer != 3 {
            return Ok(None);
        }
        let indices = Tensor::<B, 3, Int>::from_data(
            TensorData::new(vec![0i64, 2, 4], [1, 1, 3]),
            &FlexDevice,
        );
        Ok(Some(LayerSelection {
            indices,
            counts: vec![3],
        }))
    }

    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        self.log.borrow_mut().push(Call::WantsProbs(layer, phase));
        layer == 1 && phase == Phase::Decode
    }

    fn on_probs(&mut self, layer: usize, phase: Phase, probs: &Tensor<B, 4>) -> Result<()> {
        self.log.borrow_mut().push(Call::OnProbs(
            layer,
            phase,
            probs.dims().to_vec(),
            sum(probs),
        ));
        failure(layer)
    }

    fn wants_key_mass(&self, layer: usize, phase: Phase) -> bool {
        self.log.borrow_mut().push(Call::WantsKeyMass(layer, phase));
        layer == 2 && phase == LAST_PREFILL
    }

    fn on_key_mass(&mut self, layer: usize, phase: Phase, mass: &Tensor<B, 3>) -> Result<()> {
        self.log.borrow_mut().push(Call::OnKeyMass(
            layer,
            phase,
            mass.dims().to_vec(),
            sum(mass),
        ));
        failure(layer)
    }
}

/// What each method returned, called the way a model calls its hook: through the trait.
#[derive(Debug, PartialEq)]
struct Answers {
    selected: Option<(Vec<i64>, Vec<usize>)>,
    wants_key_mass: [bool; 3],
    wants_probs: [bool; 2],
    key_mass: [Option<String>; 2],
    probs: [Option<String>; 2],
}

fn drive<H: AttentionHook<B>>(hook: &mut H) -> Answers {
    let dev = FlexDevice;
    // mass [1, 2, 3] holding 0 .. 6: sum 15; probs [1, 2, 1, 3] of 0.5 each: sum 3
    let mass = Tensor::<B, 3>::from_data(
        TensorData::new(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], [1, 2, 3]),
        &dev,
    );
    let probs = Tensor::<B, 4>::full([1, 2, 1, 3], 0.5, &dev);
    let q = Tensor::<B, 4>::zeros([1, 2, 1, 4], &dev);
    let k = Tensor::<B, 4>::zeros([1, 1, 6, 4], &dev);
    let ctx = LayerAttnCtx {
        layer: 3,
        phase: Phase::Decode,
        q: &q,
        k: &k,
        ctx_lens: &[5],
        n_new: 1,
        scale: 0.5,
    };
    let selected = hook.on_layer(&ctx).unwrap().map(|sel| {
        let idx: Vec<i64> = sel.indices.into_data().convert::<i64>().to_vec().unwrap();
        (idx, sel.counts)
    });
    let err = |r: Result<()>| r.err().map(|e| e.to_string());
    Answers {
        selected,
        wants_key_mass: [
            hook.wants_key_mass(2, LAST_PREFILL),
            hook.wants_key_mass(2, Phase::Decode),
            hook.wants_key_mass(3, LAST_PREFILL),
        ],
        wants_probs: [
            hook.wants_probs(1, Phase::Decode),
            hook.wants_probs(1, LAST_PREFILL),
        ],
        key_mass: [
            err(hook.on_key_mass(2, LAST_PREFILL, &mass)),
            err(hook.on_key_mass(9, Phase::Decode, &mass)),
        ],
        probs: [
            err(hook.on_probs(1, Phase::Decode, &probs)),
            err(hook.on_probs(9, Phase::Decode, &probs)),
        ],
    }
}

fn expected_answers() -> Answers {
    Answers {
        selected: Some((vec![0, 2, 4], vec![3])),
        wants_key_mass: [true, false, false],
        wants_probs: [true, false],
        key_mass: [None, Some("model error: layer 9 refused".into())],
        probs: [None, Some("model error: layer 9 refused".into())],
    }
}

fn expected_log() -> Vec<Call> {
    vec![
        Call::OnLayer(3, Phase::Decode),
        Call::WantsKeyMass(2, LAST_PREFILL),
        Call::WantsKeyMass(2, Phase::Decode),
        Call::WantsKeyMass(3, LAST_PREFILL),
        Call::WantsProbs(1, Phase::Decode),
        Call::WantsProbs(1, LAST_PREFILL),
        Call::OnKeyMass(2, LAST_PREFILL, vec![1, 2, 3], 15.0),
        Call::OnKeyMass(9, Phase::Decode, vec![1, 2, 3], 15.0),
        Call::OnProbs(1, Phase::Decode, vec![1, 2, 1, 3], 3.0),
        Call::OnProbs(9, Phase::Decode, vec![1, 2, 1, 3], 3.0),
    ]
}

#[test]
fn the_unboxed_recorder_answers_as_written() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut hook = Recorder { log: log.clone() };
    assert_eq!(drive(&mut hook), expected_answers());
    assert_eq!(*log.borrow(), expected_log());
}

#[test]
fn a_boxed_hook_forwards_every_method() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut hook = Box::new(Recorder { log: log.clone() });
    assert_eq!(drive(&mut hook), expected_answers());
    assert_eq!(*log.borrow(), expected_log());
}

#[test]
fn a_boxed_trait_object_forwards_every_method() {
    let log = Rc::new(RefCell::new(Vec::new()));
    let mut hook: Box<dyn AttentionHook<B>> = Box::new(Recorder { log: log.clone() });
    assert_eq!(drive(&mut hook), expected_answers());
    assert_eq!(*log.borrow(), expected_log());
}
