//! A trainer in Rust on zerod: the three-layer MLP of examples/c/train_mlp.c
//! (2 -> 64 -> 64 -> 3, ReLU, softmax cross-entropy) learning to classify the
//! points of a three-armed spiral it generates. The trainer does all the
//! math, by hand; zerod owns the parameters, gradients and optimizer state
//! and applies the optimizer the job script names.
//!
//!   train_mlp_rs [--job job.lua] [--steps N] [--dtype f32|bf16|f16] [--quiet]
//!   zerod run --nproc 2 --job job.lua -- train_mlp_rs      (data parallel)
//!
//! It connects where the environment says (embedded when run alone, the
//! daemon under `zerod run`, the node's daemon it starts on demand under
//! another launcher: torchrun, mpirun, srun). Every rank walks the same
//! shuffled order and takes its own slice of each global batch of
//! BATCH * world_size points.
//! Rank 0 prints the loss at every step. The generator, the initialisation
//! and the order of every floating-point operation are the C trainer's, so
//! both print the same numbers.

use std::process::ExitCode;

use zerod::{
    Client, Dtype, GradView, MemKind, Model, ModelOptions, ModuleId, ParamDesc, ParamId, Tier,
};

const CLASSES: usize = 3;
const PER_CLASS: usize = 300;
const POINTS: usize = CLASSES * PER_CLASS;
const HIDDEN: usize = 64;
const BATCH: usize = 100;

/// The C example's job script, found from this crate wherever it is run.
const DEFAULT_JOB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../c/job.lua");

/// A small deterministic generator (xorshift64*), so every run is the same.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / 9_007_199_254_740_992.0
    }

    fn normal(&mut self) -> f64 {
        let u = self.uniform().max(1e-12);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// One dense layer y = x W^T + b with W [out, in], as a zerod module.
struct Layer {
    name: &'static str,
    inputs: usize,
    outputs: usize,
    module: ModuleId,
    weight: ParamId,
    bias: ParamId,
}

impl Layer {
    fn register(
        model: &mut Model,
        name: &'static str,
        inputs: usize,
        outputs: usize,
        dtype: Dtype,
        rng: &mut Rng,
    ) -> zerod::Result<Layer> {
        let scale = (2.0 / inputs as f64).sqrt(); // He initialisation for ReLU
        let init: Vec<f32> = (0..inputs * outputs)
            .map(|_| (rng.normal() * scale) as f32)
            .collect();
        let (wname, bname) = (format!("{}.weight", name), format!("{}.bias", name));
        let wshape = [outputs as i64, inputs as i64];
        let bshape = [outputs as i64];
        let weight = model.register_param(
            &ParamDesc::new(&wname, name, &wshape)
                .dtype(dtype)
                .init(&init),
        )?;
        let bias = model.register_param(&ParamDesc::new(&bname, name, &bshape).dtype(dtype))?; // zeros
        Ok(Layer {
            name,
            inputs,
            outputs,
            module: ModuleId(-1),
            weight,
            bias,
        })
    }

    /// y = x W^T + b over n rows, through a ReLU if asked.
    fn forward(
        &self,
        model: &mut Model,
        x: &[f32],
        y: &mut [f32],
        n: usize,
        relu: bool,
    ) -> zerod::Result<()> {
        let fwd = model.forward(self.module)?;
        {
            // Borrowed straight from zerod when f32, converted when 16-bit;
            // either way gone before the guard ends.
            let (w, b) = (
                fwd.param(self.weight)?.to_f32(),
                fwd.param(self.bias)?.to_f32(),
            );
            for r in 0..n {
                for o in 0..self.outputs {
                    let mut s = b[o];
                    for i in 0..self.inputs {
                        s += x[r * self.inputs + i] * w[o * self.inputs + i];
                    }
                    y[r * self.outputs + o] = if relu && s < 0.0 { 0.0 } else { s };
                }
            }
        }
        fwd.end()
    }

    /// Given dy (already through the activation), writes dW and db into
    /// zerod's gradient views and dx (if wanted) for the layer below.
    fn backward(
        &self,
        model: &mut Model,
        x: &[f32],
        dy: &[f32],
        dx: Option<&mut [f32]>,
        n: usize,
    ) -> zerod::Result<()> {
        let (inputs, outputs) = (self.inputs, self.outputs);
        let mut bwd = model.backward(self.module)?;
        let ([wv], [mut gw, mut gb]) = bwd.views([self.weight], [self.weight, self.bias])?;
        write_grad(&mut gb, |db| {
            for (o, d) in db.iter_mut().enumerate() {
                let mut s = 0.0f32;
                for r in 0..n {
                    s += dy[r * outputs + o];
                }
                *d = s;
            }
        });
        write_grad(&mut gw, |dw| {
            for o in 0..outputs {
                for i in 0..inputs {
                    let mut s = 0.0f32;
                    for r in 0..n {
                        s += dy[r * outputs + o] * x[r * inputs + i];
                    }
                    dw[o * inputs + i] = s;
                }
            }
        });
        if let Some(dx) = dx {
            let w = wv.to_f32();
            for r in 0..n {
                for i in 0..inputs {
                    let mut s = 0.0f32;
                    for o in 0..outputs {
                        s += dy[r * outputs + o] * w[o * inputs + i];
                    }
                    dx[r * inputs + i] = s;
                }
            }
        }
        bwd.end()
    }
}

/// Lets `fill` write a gradient as f32: in place when the buffer is f32,
/// through a converted copy when it is 16-bit.
fn write_grad(g: &mut GradView, fill: impl FnOnce(&mut [f32])) {
    match g.as_mut_slice::<f32>() {
        Some(s) => fill(s),
        None => {
            let mut tmp = vec![0.0f32; g.len()];
            fill(&mut tmp);
            g.copy_from_f32(&tmp);
        }
    }
}

fn make_spiral(rng: &mut Rng) -> (Vec<f32>, Vec<usize>) {
    let mut x = vec![0.0f32; POINTS * 2];
    let mut y = vec![0usize; POINTS];
    for c in 0..CLASSES {
        for i in 0..PER_CLASS {
            let r = i as f64 / PER_CLASS as f64;
            let t = c as f64 * 4.0 + 4.0 * r + rng.normal() * 0.2;
            let k = c * PER_CLASS + i;
            x[2 * k] = (r * t.sin()) as f32;
            x[2 * k + 1] = (r * t.cos()) as f32;
            y[k] = c;
        }
    }
    (x, y)
}

struct Args {
    job: Option<String>,
    steps: i64,
    dtype: Dtype,
    quiet: bool,
}

fn parse_args() -> Option<Args> {
    // Under `zerod run` the job is ZEROD_JOB's (None asks zerod for it).
    let job = if std::env::var_os("ZEROD_JOB").is_some() {
        None
    } else {
        Some(DEFAULT_JOB.to_string())
    };
    let mut a = Args {
        job,
        steps: 300,
        dtype: Dtype::F32,
        quiet: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--job" => a.job = Some(it.next()?),
            "--steps" => a.steps = it.next()?.parse().ok()?,
            "--quiet" => a.quiet = true,
            "--dtype" => {
                a.dtype = match it.next()?.as_str() {
                    "f32" => Dtype::F32,
                    "bf16" => Dtype::Bf16,
                    "f16" => Dtype::F16,
                    _ => return None,
                }
            }
            _ => return None,
        }
    }
    Some(a)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Some(a) => a,
        None => {
            eprintln!(
                "usage: train_mlp_rs [--job job.lua] [--steps N] [--dtype f32|bf16|f16] [--quiet]"
            );
            return ExitCode::from(2);
        }
    };
    match train(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train_mlp_rs: {}", e);
            ExitCode::FAILURE
        }
    }
}

fn train(args: &Args) -> zerod::Result<()> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (xs, ys) = make_spiral(&mut rng);

    name_job_for_node_daemon(args.job.as_deref());
    // ZEROD_ENDPOINT (zerod run); one of several ranks of another launcher:
    // the node's daemon (docs/daemon.md); else embedded
    let client = Client::connect(None)?;
    let info = client.info()?;
    let (rank, world) = (info.rank as usize, info.world_size as usize);
    if world > POINTS / BATCH {
        return Err(zerod::Error::new(
            zerod::Status::InvalidArgument,
            format!(
                "at most {} ranks: a global batch must fit the data",
                POINTS / BATCH
            ),
        ));
    }
    let options = match &args.job {
        Some(path) => ModelOptions::script_path(path),
        None => ModelOptions::from_env(),
    };
    let mut model = Model::create(&client, &options)?;

    let mut layers = [
        Layer::register(&mut model, "fc1", 2, HIDDEN, args.dtype, &mut rng)?,
        Layer::register(&mut model, "fc2", HIDDEN, HIDDEN, args.dtype, &mut rng)?,
        Layer::register(&mut model, "fc3", HIDDEN, CLASSES, args.dtype, &mut rng)?,
    ];
    model.finalize()?;
    for l in layers.iter_mut() {
        l.module = model.find_module(l.name)?;
    }

    let mut xb = vec![0.0f32; BATCH * 2];
    let mut yb = vec![0usize; BATCH];
    let (mut h1, mut h2) = (vec![0.0f32; BATCH * HIDDEN], vec![0.0f32; BATCH * HIDDEN]);
    let mut logits = vec![0.0f32; BATCH * CLASSES];
    let mut dlogits = vec![0.0f32; BATCH * CLASSES];
    let (mut dh1, mut dh2) = (vec![0.0f32; BATCH * HIDDEN], vec![0.0f32; BATCH * HIDDEN]);
    let mut order: Vec<usize> = (0..POINTS).collect();
    let mut cursor = POINTS;
    let mut loss;

    loop {
        // A fresh shuffled pass over the data when one ends (the same order
        // on every rank: the generator is seeded alike).
        if cursor + BATCH * world > POINTS {
            for i in (1..POINTS).rev() {
                let j = (rng.uniform() * (i + 1) as f64) as usize;
                order.swap(i, j);
            }
            cursor = 0;
        }
        for r in 0..BATCH {
            let k = order[cursor + rank * BATCH + r];
            xb[2 * r] = xs[2 * k];
            xb[2 * r + 1] = xs[2 * k + 1];
            yb[r] = ys[k];
        }
        cursor += BATCH * world;

        layers[0].forward(&mut model, &xb, &mut h1, BATCH, true)?;
        layers[1].forward(&mut model, &h1, &mut h2, BATCH, true)?;
        layers[2].forward(&mut model, &h2, &mut logits, BATCH, false)?;

        // Softmax cross-entropy, mean over the batch; the gradient is scaled
        // by the loss scale (1 unless the job is fp16).
        let scale = model.loss_scale()?;
        loss = 0.0f64;
        for r in 0..BATCH {
            let row = &logits[r * CLASSES..(r + 1) * CLASSES];
            let mx = row[1..].iter().fold(row[0], |m, &v| m.max(v));
            let z: f64 = row.iter().map(|&v| f64::from(v - mx).exp()).sum();
            for c in 0..CLASSES {
                let p = f64::from(row[c] - mx).exp() / z;
                let target = if c == yb[r] { 1.0 } else { 0.0 };
                dlogits[r * CLASSES + c] = ((p - target) / BATCH as f64 * scale) as f32;
            }
            loss -= f64::from(row[yb[r]] - mx) - z.ln();
        }
        loss /= BATCH as f64;

        layers[2].backward(&mut model, &h2, &dlogits, Some(&mut dh2), BATCH)?;
        relu_backward(&h2, &mut dh2);
        layers[1].backward(&mut model, &h1, &dh2, Some(&mut dh1), BATCH)?;
        relu_backward(&h1, &mut dh1);
        layers[0].backward(&mut model, &xb, &dh1, None, BATCH)?;

        let sr = model.step()?;
        // zerod's metrics and the trace's loss plot, as train_mlp.c reports.
        model.report(0, BATCH as u64, Some(loss))?;
        if sr.boundary {
            if rank == 0 && (!args.quiet || sr.step == args.steps) {
                println!(
                    "step {:4}  loss {:.4}  lr {:.5}  grad_norm {:.4}{}",
                    sr.step,
                    loss,
                    sr.lr,
                    sr.grad_norm,
                    if sr.skipped {
                        "  (skipped: overflow)"
                    } else {
                        ""
                    }
                );
            }
            if sr.step >= args.steps {
                break;
            }
        }
    }

    // Accuracy on the whole dataset, through zerod's trained weights.
    let mut correct = 0;
    for k in 0..POINTS {
        layers[0].forward(&mut model, &xs[2 * k..2 * k + 2], &mut h1, 1, true)?;
        layers[1].forward(&mut model, &h1, &mut h2, 1, true)?;
        layers[2].forward(&mut model, &h2, &mut logits, 1, false)?;
        let best = (1..CLASSES).fold(0, |b, c| if logits[c] > logits[b] { c } else { b });
        correct += usize::from(best == ys[k]);
    }
    // Every tier's bytes: with offload most state is off the device.
    let mem = model.memory(Tier::Device, MemKind::All)?;
    let host = model.memory(Tier::Host, MemKind::All)?;
    let nvme = model.memory(Tier::Nvme, MemKind::All)?;
    if rank == 0 {
        println!(
            "final loss {:.4}  accuracy {:.1}%  ranks {}  model state per rank: device {} bytes (peak {}), host {}, nvme {}",
            loss,
            100.0 * correct as f64 / POINTS as f64,
            world,
            mem.current,
            mem.peak,
            host.current,
            nvme.current
        );
    }
    Ok(())
}

/// Under another launcher (torchrun, mpirun, srun) with no ZEROD_ENDPOINT,
/// `Client::connect` joins this node's daemon or starts it, and that daemon
/// needs the job script before any rank connects: ZEROD_JOB, which a
/// caller's own value keeps. Called before any thread starts, as set_var
/// must be.
fn name_job_for_node_daemon(job: Option<&str>) {
    if let Some(path) = job {
        if std::env::var_os("ZEROD_JOB").is_none() {
            std::env::set_var("ZEROD_JOB", path);
        }
    }
}

fn relu_backward(h: &[f32], dh: &mut [f32]) {
    for (d, &a) in dh.iter_mut().zip(h) {
        if a <= 0.0 {
            *d = 0.0;
        }
    }
}
