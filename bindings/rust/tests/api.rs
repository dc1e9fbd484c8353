//! The safe API against an embedded engine. SGD without momentum keeps every
//! expected value computable by hand.

use zerod::{
    ffi, Bf16, Client, Dtype, Elements, MemKind, Model, ModelOptions, ModuleId, ParamDesc, ParamId,
    Status, Tier, F16,
};

fn client() -> Client {
    Client::connect(Some("embedded:")).expect("embedded client")
}

fn sgd(lr: f64, extra: &str) -> String {
    format!(
        "return {{ optimizer = {{ type = 'sgd', lr = {} }}, {} }}",
        lr, extra
    )
}

/// A finalized model with one parameter "w" of `init.len()` elements in
/// module "layer".
fn one_param<'c>(client: &'c Client, job: &str, init: &[f32]) -> (Model<'c>, ParamId, ModuleId) {
    let mut model = Model::from_script_text(client, job).expect("model");
    let w = model
        .register_param(&ParamDesc::new("w", "layer", &[init.len() as i64]).init(init))
        .expect("register");
    model.finalize().expect("finalize");
    let layer = model.find_module("layer").expect("module");
    (model, w, layer)
}

/// One micro-batch whose gradient for `w` is given.
fn micro_step(model: &mut Model, layer: ModuleId, w: ParamId, grad: &[f32]) -> zerod::StepResult {
    model.forward(layer).unwrap().end().unwrap();
    let mut bwd = model.backward(layer).unwrap();
    bwd.grad_mut(w).unwrap().copy_from_f32(grad);
    bwd.end().unwrap();
    model.step().unwrap()
}

#[test]
fn versions() {
    assert_eq!(zerod::abi_version() >> 16, zerod::ABI_VERSION >> 16);
    assert!(!zerod::version().is_empty());
}

#[test]
fn an_embedded_client_is_rank_0_of_1() {
    let info = client().info().unwrap();
    assert_eq!(
        (info.rank, info.world_size, info.local_rank, info.embedded),
        (0, 1, 0, true)
    );
}

#[test]
fn a_bad_endpoint_is_an_invalid_argument() {
    let e = Client::connect(Some("tcp:somewhere")).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(
        e.message().contains("unknown endpoint 'tcp:somewhere'"),
        "{}",
        e
    );
    assert!(
        e.to_string()
            .starts_with("ZD_ERR_INVALID_ARGUMENT: zd_connect: "),
        "{}",
        e
    );
}

#[test]
fn a_client_may_move_between_threads() {
    fn send<T: Send>(t: T) -> T {
        t
    }
    let c = send(client());
    std::thread::spawn(move || c.info().unwrap())
        .join()
        .unwrap();
}

#[test]
fn sgd_update_is_exact() {
    let c = client();
    let (mut model, w, layer) = one_param(&c, &sgd(0.5, ""), &[1.0, 2.0, 3.0]);
    {
        let fwd = model.forward(layer).unwrap();
        let v = fwd.param(w).unwrap();
        assert_eq!(v.as_slice::<f32>(), Some(&[1.0f32, 2.0, 3.0][..]));
        assert!(v.read_only());
        assert_eq!(
            (v.dtype(), v.shape(), v.len()),
            (Dtype::F32, &[3i64][..], 3)
        );
        assert_eq!(v.raw().device_type, ffi::ZD_DEVICE_CPU);
    }
    let mut bwd = model.backward(layer).unwrap();
    {
        let mut g = bwd.grad_mut(w).unwrap();
        assert_eq!(
            g.as_slice::<f32>(),
            Some(&[0.0f32; 3][..]),
            "gradient views start at zero"
        );
        g.as_mut_slice::<f32>()
            .unwrap()
            .copy_from_slice(&[0.5, -1.0, 2.0]);
    }
    bwd.end().unwrap();
    let r = model.step().unwrap();
    assert!(r.boundary && r.applied && !r.skipped);
    assert_eq!((r.step, r.micro_step, r.lr, r.loss_scale), (1, 1, 0.5, 1.0));
    assert!(
        (r.grad_norm - 5.25f64.sqrt()).abs() < 1e-6,
        "{}",
        r.grad_norm
    );
    assert_eq!(
        model.param_read_vec::<f32>(w).unwrap(),
        vec![0.75, 2.5, 2.0]
    );
    let fwd = model.forward(layer).unwrap();
    assert_eq!(
        fwd.param(w).unwrap().to_f32().as_ref(),
        &[0.75, 2.5, 2.0],
        "the working copy follows the master"
    );
}

#[test]
fn gradients_average_over_a_window_and_contributions_add() {
    let c = client();
    let (mut model, w, layer) =
        one_param(&c, &sgd(1.0, "gradient_accumulation_steps = 2"), &[0.0; 3]);
    // Micro-batch 1 runs the module twice (weight tying): contributions add.
    for _ in 0..2 {
        let mut bwd = model.backward(layer).unwrap();
        let mut g = bwd.grad_mut(w).unwrap();
        assert_eq!(g.to_vec(), vec![0.0; 3]);
        g.copy_from_f32(&[1.0, 1.0, 1.0]);
    }
    let r = model.step().unwrap();
    assert!(!r.boundary && !r.applied);
    assert_eq!(
        model.param_read_vec::<f32>(w).unwrap(),
        vec![0.0; 3],
        "nothing applied inside a window"
    );
    let r = micro_step(&mut model, layer, w, &[4.0, 0.0, 2.0]);
    assert!(r.boundary && r.applied);
    // mean of {2, 2, 2} and {4, 0, 2}
    assert_eq!(
        model.param_read_vec::<f32>(w).unwrap(),
        vec![-3.0, -1.0, -2.0]
    );
}

#[test]
fn a_set_lr_replaces_the_schedule_from_the_next_boundary() {
    let c = client();
    let (mut model, w, layer) = one_param(&c, &sgd(0.5, ""), &[1.0, 2.0]);
    let r = micro_step(&mut model, layer, w, &[1.0, 1.0]);
    assert_eq!(r.lr, 0.5, "the job's lr");
    model.set_lr(0.25).unwrap();
    let r = micro_step(&mut model, layer, w, &[1.0, 1.0]);
    assert_eq!(r.lr, 0.25, "the lr set");
    // 1 - 0.5 - 0.25, 2 - 0.5 - 0.25
    assert_eq!(model.param_read_vec::<f32>(w).unwrap(), vec![0.25, 1.25]);
    for bad in [f64::NAN, f64::INFINITY, -0.5] {
        let e = model.set_lr(bad).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(e.message().contains("finite and >= 0"), "{}", e);
    }
    let r = micro_step(&mut model, layer, w, &[0.0, 0.0]);
    assert_eq!(r.lr, 0.25, "a refused value leaves the lr in force");
}

trait ToVec {
    fn to_vec(&self) -> Vec<f32>;
}
impl ToVec for zerod::GradView<'_> {
    fn to_vec(&self) -> Vec<f32> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }
}

/// zerod's rule behind the advice for gradients a cuda backward could not
/// zero (docs/rust.md): set_step drops added gradients between steps only.
#[test]
fn set_step_inside_a_window_is_refused() {
    let c = client();
    let (mut model, w, layer) =
        one_param(&c, &sgd(1.0, "gradient_accumulation_steps = 2"), &[0.0; 2]);
    let step = model.optimizer_info().unwrap().step;
    // At a window's first micro-batch, before its step(), it drops them.
    model.forward(layer).unwrap().end().unwrap();
    let mut bwd = model.backward(layer).unwrap();
    bwd.grad_mut(w).unwrap().copy_from_f32(&[8.0, 8.0]);
    bwd.end().unwrap();
    model.set_step(step).unwrap();
    // After a step() that ended no window, it is refused.
    let r = micro_step(&mut model, layer, w, &[1.0, 1.0]);
    assert!(!r.boundary, "{:?}", r);
    let e = model.set_step(step).unwrap_err();
    assert_eq!(e.status(), Status::InvalidState, "{}", e);
    assert!(
        e.message().contains("inside an accumulation window"),
        "{}",
        e
    );
    let r = micro_step(&mut model, layer, w, &[3.0, 3.0]);
    assert!(r.applied, "{:?}", r);
    // mean of {1, 1} and {3, 3}: the dropped 8s are not in it
    assert_eq!(model.param_read_vec::<f32>(w).unwrap(), vec![-2.0, -2.0]);
}

#[test]
fn dropping_a_guard_ends_its_module() {
    let c = client();
    let (mut model, _, layer) = one_param(&c, &sgd(0.1, ""), &[1.0]);
    {
        let _fwd = model.forward(layer).unwrap();
    }
    {
        let _bwd = model.backward(layer).unwrap();
    }
    // A module still begun would make this ZD_ERR_INVALID_STATE.
    model.step().unwrap();
}

#[test]
fn a_panic_in_a_backward_adds_none_of_its_gradients() {
    let c = client();
    let (mut model, w, layer) = one_param(&c, &sgd(0.5, ""), &[1.0, 2.0, 3.0]);
    model.forward(layer).unwrap().end().unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut bwd = model.backward(layer).unwrap();
        bwd.grad_mut(w).unwrap().copy_from_f32(&[4.0, 4.0, 4.0]);
        panic!("the trainer's backward fails half way");
    }));
    assert!(unwound.is_err());
    let r = model.step().unwrap();
    assert!(r.applied && r.grad_norm == 0.0, "{:?}", r);
    assert_eq!(
        model.param_read_vec::<f32>(w).unwrap(),
        vec![1.0, 2.0, 3.0],
        "the guard dropped in the panic zeroed what was written before its end"
    );
    // discard(): the same on purpose, for an error returned early.
    model.forward(layer).unwrap().end().unwrap();
    let mut bwd = model.backward(layer).unwrap();
    bwd.grad_mut(w).unwrap().copy_from_f32(&[4.0, 4.0, 4.0]);
    bwd.discard().unwrap();
    model.step().unwrap();
    assert_eq!(model.param_read_vec::<f32>(w).unwrap(), vec![1.0, 2.0, 3.0]);
    // A backward ended as usual still adds its gradients.
    micro_step(&mut model, layer, w, &[2.0, 2.0, 2.0]);
    assert_eq!(model.param_read_vec::<f32>(w).unwrap(), vec![0.0, 1.0, 2.0]);
}

#[test]
fn call_order_errors_name_the_module() {
    let c = client();
    let mut model = Model::from_script_text(&c, &sgd(0.1, "")).unwrap();
    let wa = model
        .register_param(&ParamDesc::new("wa", "a", &[2]))
        .unwrap();
    let wb = model
        .register_param(&ParamDesc::new("wb", "b", &[2]))
        .unwrap();
    let e = model.forward(ModuleId(0)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidState, "{}", e);
    model.finalize().unwrap();
    let (a, b) = (
        model.find_module("a").unwrap(),
        model.find_module("b").unwrap(),
    );

    // An _end the guard did not expect: ended behind its back.
    let raw = model.as_ptr();
    let bwd = model.backward(a).unwrap();
    // SAFETY: a live model; no view of the module is alive.
    assert_eq!(unsafe { ffi::zd_backward_end(raw, a.0) }, ffi::ZD_OK);
    let e = bwd.end().unwrap_err();
    assert_eq!(e.status(), Status::InvalidState);
    assert!(
        e.message()
            .contains("zd_backward_end: module 'a' is not in backward"),
        "{}",
        e
    );

    let mut fwd = model.forward(a).unwrap();
    let e = fwd.forward(a).unwrap_err();
    assert_eq!(e.status(), Status::InvalidState);
    assert!(
        e.message().contains("module 'a' is already in forward"),
        "{}",
        e
    );
    let e = fwd.param(wb).unwrap_err();
    assert_eq!(e.status(), Status::InvalidState);
    assert!(
        e.message()
            .contains("parameter 'wb' is not resident: its module 'b'"),
        "{}",
        e
    );
    {
        let mut inner = fwd.forward(b).unwrap(); // modules may nest
        assert_eq!(inner.param(wb).unwrap().len(), 2);
        assert_eq!(
            inner.param(wa).unwrap().len(),
            2,
            "the enclosing module is still begun"
        );
        let e = inner.forward(ModuleId(99)).unwrap_err();
        assert_eq!(e.status(), Status::NotFound);
        assert!(e.message().contains("no module with id 99"), "{}", e);
    }
    fwd.end().unwrap();

    let mut bwd = model.backward(b).unwrap();
    let e = bwd.grad_mut(wa).unwrap_err();
    assert_eq!(e.status(), Status::InvalidState);
    assert!(
        e.message()
            .contains("parameter 'wa' has no gradient buffer now"),
        "{}",
        e
    );
    let e = bwd.forward(b).unwrap_err();
    assert_eq!(e.status(), Status::InvalidState);
    assert!(e.message().contains("module 'b' is in backward"), "{}", e);
    bwd.forward(a).unwrap().end().unwrap(); // recomputation inside a backward
    bwd.end().unwrap();

    let e = model
        .register_param(&ParamDesc::new("late", "a", &[1]))
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidState, "{}", e);
    assert_eq!(model.finalize().unwrap_err().status(), Status::InvalidState);
    let e = model.find_module("nope").unwrap_err();
    assert_eq!(e.status(), Status::NotFound);
    assert!(e.message().contains("'nope'"), "{}", e);
    assert_eq!(model.last_error(), e.message());
    // Nothing above changed the model: a whole micro-batch still runs.
    micro_step(&mut model, a, wa, &[1.0, 1.0]);
}

#[test]
fn a_bad_job_script_is_a_config_error_with_file_and_line() {
    let c = client();
    let script = "return {\n  optimizer = { type = 'sgd' },\n  gradient_clipp1ng = 1.0,\n}\n";
    let e = Model::from_script_text(&c, script).unwrap_err();
    assert_eq!(e.status(), Status::Config);
    assert!(
        e.message()
            .contains("job.lua:3: unknown key 'gradient_clipp1ng'"),
        "{}",
        e
    );
    let e = Model::create(
        &c,
        &ModelOptions::script_text(script).script_name("mine.lua"),
    )
    .unwrap_err();
    assert!(e.message().contains("mine.lua:3: "), "{}", e);
    let e = Model::from_script_path(&c, "/nonexistent/job.lua").unwrap_err();
    assert!(e.message().contains("/nonexistent/job.lua"), "{}", e);
}

#[test]
fn from_env_without_zerod_job_says_what_to_set() {
    if std::env::var_os("ZEROD_JOB").is_some() {
        return; // under `zerod run` it would succeed
    }
    let c = client();
    let e = Model::from_env(&c).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("ZEROD_JOB"), "{}", e);
}

#[test]
fn memory_figures() {
    let c = client();
    let (model, _, _) = one_param(
        &c,
        &sgd(0.1, "budgets = { device = '1MiB' }"),
        &[1.0, 2.0, 3.0],
    );
    let all = model.memory(Tier::Device, MemKind::All).unwrap();
    assert!(all.current >= 24 && all.peak >= all.current, "{:?}", all);
    assert_eq!(all.budget, Some(1 << 20));
    for kind in [MemKind::Params, MemKind::Master] {
        let m = model.memory(Tier::Device, kind).unwrap();
        assert!(m.current >= 12, "{:?}: {:?}", kind, m);
    }
    let (unbounded, _, _) = one_param(&c, &sgd(0.1, ""), &[1.0]);
    assert_eq!(
        unbounded.memory(Tier::Device, MemKind::All).unwrap().budget,
        None
    );
    let e = model
        .memory_of_rank(5, Tier::Device, MemKind::All)
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("rank 5"), "{}", e);
}

#[test]
fn param_read_and_write_round_trip() {
    let c = client();
    let (mut model, w, layer) = one_param(&c, &sgd(0.1, ""), &[1.0, 2.0, 3.0]);
    model.param_write(w, &[4.0f32, -0.5, 6.0]).unwrap();
    assert_eq!(
        model.param_read_vec::<f32>(w).unwrap(),
        vec![4.0, -0.5, 6.0]
    );
    let halves: Vec<f32> = model
        .param_read_vec::<Bf16>(w)
        .unwrap()
        .iter()
        .map(|h| h.to_f32())
        .collect();
    assert_eq!(halves, vec![4.0, -0.5, 6.0]);
    model
        .param_write(
            w,
            &[F16::from_f32(0.25), F16::from_f32(1.5), F16::from_f32(-8.0)],
        )
        .unwrap();
    assert_eq!(
        model
            .forward(layer)
            .unwrap()
            .param(w)
            .unwrap()
            .to_f32()
            .as_ref(),
        &[0.25, 1.5, -8.0]
    );
    let e = model.param_read(w, &mut [0.0f32; 2]).unwrap_err();
    assert_eq!(e.status(), Status::ShapeMismatch);
    assert!(
        e.message()
            .contains("'w': it has 3 elements (12 bytes as f32), the buffer has 8 bytes"),
        "{}",
        e
    );
}

#[test]
fn bf16_parameters() {
    let c = client();
    let mut model = Model::from_script_text(&c, &sgd(1.0, "precision = 'bf16'")).unwrap();
    let w = model
        .register_param(
            &ParamDesc::new("w", "layer", &[3])
                .dtype(Dtype::Bf16)
                .init(&[1.0f32, 0.5, -2.0]),
        )
        .unwrap();
    model.finalize().unwrap();
    let layer = model.find_module("layer").unwrap();
    {
        let fwd = model.forward(layer).unwrap();
        let v = fwd.param(w).unwrap();
        assert_eq!(v.dtype(), Dtype::Bf16);
        assert!(v.as_slice::<f32>().is_none());
        assert_eq!(v.as_slice::<Bf16>().unwrap()[1], Bf16::from_f32(0.5));
        assert!(matches!(v.elements(), Elements::Bf16(s) if s.len() == 3));
        assert_eq!(v.get(2), -2.0);
        assert_eq!(v.to_f32().as_ref(), &[1.0, 0.5, -2.0]);
    }
    let mut bwd = model.backward(layer).unwrap();
    let mut g = bwd.grad_mut(w).unwrap();
    assert_eq!(g.dtype(), Dtype::Bf16);
    g.copy_from_f32(&[0.5, 0.5, 1.0]);
    g.set(0, 0.25);
    drop(bwd);
    model.step().unwrap();
    assert_eq!(
        model.param_read_vec::<f32>(w).unwrap(),
        vec![0.75, 0.0, -3.0]
    );
}

#[test]
fn several_views_at_once() {
    let c = client();
    let mut model = Model::from_script_text(&c, &sgd(1.0, "")).unwrap();
    let w = model
        .register_param(&ParamDesc::new("fc.weight", "fc", &[2, 2]).init(&[1.0f32, 2.0, 3.0, 4.0]))
        .unwrap();
    let b = model
        .register_param(&ParamDesc::new("fc.bias", "fc", &[2]))
        .unwrap();
    model.finalize().unwrap();
    let fc = model.find_module("fc").unwrap();
    let mut bwd = model.backward(fc).unwrap();
    // The raw view of W, which a CUDA backward reads (param refuses device
    // memory), is the one param wraps.
    let raw = bwd.param_raw(w).unwrap();
    let wrapped = *bwd.param(w).unwrap().raw();
    assert_eq!(raw, wrapped);
    assert!(!raw.data.is_null() && raw.nbytes == 16, "{:?}", raw);
    {
        let ([wv], [mut gw, mut gb]) = bwd.views([w], [w, b]).unwrap();
        // dW = W, db = first row of W: reads and writes side by side.
        gw.copy_from_f32(wv.as_slice::<f32>().unwrap());
        gb.copy_from_f32(&wv.to_f32()[..2]);
    }
    let e = bwd.grads_mut([w, w]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
    bwd.end().unwrap();
    model.step().unwrap();
    assert_eq!(model.param_read_vec::<f32>(w).unwrap(), vec![0.0; 4]);
    assert_eq!(model.param_read_vec::<f32>(b).unwrap(), vec![-1.0, -2.0]);
}

#[test]
fn parameters_and_modules_are_described() {
    let c = client();
    let mut model = Model::from_script_text(&c, &sgd(0.1, "")).unwrap();
    let w = model
        .register_param(&ParamDesc::new("fc.weight", "fc", &[3, 2]))
        .unwrap();
    let b = model
        .register_param(&ParamDesc::new("fc.bias", "fc", &[3]))
        .unwrap();
    let o = model
        .register_param(&ParamDesc::new("out.weight", "out", &[1, 3]))
        .unwrap();
    assert_eq!((w, b, o), (ParamId(0), ParamId(1), ParamId(2)));
    model.finalize().unwrap();
    assert_eq!(
        (model.param_count().unwrap(), model.module_count().unwrap()),
        (3, 2)
    );
    assert_eq!(model.find_param("fc.bias").unwrap(), b);
    let info = model.param_info(w).unwrap();
    assert_eq!(
        (
            info.name.as_str(),
            info.dtype,
            info.module,
            &info.shape[..],
            info.numel
        ),
        ("fc.weight", Dtype::F32, ModuleId(0), &[3i64, 2][..], 6)
    );
    let m = model.module_info(ModuleId(0)).unwrap();
    assert_eq!((m.name.as_str(), m.params), ("fc", vec![w, b]));
    assert_eq!(model.loss_scale().unwrap(), 1.0);
    assert_eq!(
        model.param_info(ParamId(7)).unwrap_err().status(),
        Status::NotFound
    );
}

#[test]
fn init_must_match_the_shape() {
    let c = client();
    let mut model = Model::from_script_text(&c, &sgd(0.1, "")).unwrap();
    let e = model
        .register_param(&ParamDesc::new("w", "m", &[3]).init(&[1.0f32, 2.0]))
        .unwrap_err();
    assert_eq!(e.status(), Status::ShapeMismatch);
    assert!(
        e.message()
            .contains("parameter 'w': init has 2 elements, the shape [3] needs 3"),
        "{}",
        e
    );
    // A shape zerod refuses is refused by zerod, without reading init.
    let e = model
        .register_param(&ParamDesc::new("w", "m", &[0, 3]).init(&[1.0f32]))
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("extents must be positive"), "{}", e);
    // So is a shape of no dimension or of more than ZD_MAX_DIMS: no element
    // count is checked against init (here 2, which neither would need).
    for (shape, ndim) in [(&[][..], 0), (&[2i64; 9][..], 9)] {
        let e = model
            .register_param(&ParamDesc::new("w", "m", shape).init(&[1.0f32, 2.0]))
            .unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{}", e);
        assert!(
            e.message()
                .contains(&format!("ndim is {}; 1..8 are allowed", ndim)),
            "{}",
            e
        );
    }
    let e = model
        .register_param(&ParamDesc::new("w\0", "m", &[1]))
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
}

#[test]
fn statuses_map_both_ways() {
    assert_eq!(Status::from_raw(ffi::ZD_OK), None);
    for raw in 1..=15 {
        let s = Status::from_raw(raw).unwrap();
        assert!(!matches!(s, Status::Unknown(_)), "{}", raw);
        assert_eq!(s.raw(), raw);
        // SAFETY: any value; a static string.
        let c_name = unsafe { std::ffi::CStr::from_ptr(ffi::zd_status_str(raw)) };
        assert_eq!(s.name(), c_name.to_str().unwrap());
    }
    let u = Status::from_raw(99).unwrap();
    assert_eq!((u, u.raw()), (Status::Unknown(99), 99));
    assert!(u.to_string().contains("99"), "{}", u);
}

#[test]
fn half_precision_conversions() {
    assert_eq!(F16::from_f32(1.0), F16(0x3c00));
    assert_eq!(F16::from_f32(65504.0), F16(0x7bff));
    assert_eq!(F16::from_f32(65520.0), F16(0x7c00)); // rounds to infinity
    assert_eq!(F16::from_f32(-0.0), F16(0x8000));
    let tiny = f32::from_bits(0x3380_0000); // 2^-24, the smallest subnormal half
    assert_eq!(F16::from_f32(tiny), F16(1));
    assert_eq!(F16::from_f32(tiny * 0.5), F16(0)); // a tie goes to even
    assert_eq!(F16::from_f32(tiny * 1.5), F16(2));
    assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
    assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0), Bf16(0x3f80)); // a tie goes to even
    assert_eq!(Bf16::from_f32(1.0 + 3.0 / 256.0), Bf16(0x3f82));
    assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    // Every non-NaN value survives the round trip through f32.
    for bits in 0..=u16::MAX {
        let h = F16(bits);
        if !h.to_f32().is_nan() {
            assert_eq!(F16::from_f32(h.to_f32()), h, "{:#06x}", bits);
        }
        let b = Bf16(bits);
        if !b.to_f32().is_nan() {
            assert_eq!(Bf16::from_f32(b.to_f32()), b, "{:#06x}", bits);
        }
    }
}

#[test]
fn a_checkpoint_of_the_optimizer_resumes_exactly() {
    let job = "return { optimizer = { type = 'adamw', lr = 0.01 } }";
    let grad = |s: usize| -> Vec<f32> { (0..8).map(|i| ((s * 3 + i) % 5) as f32 * 0.1 - 0.2).collect() };
    let c = client();
    let init = [0.5f32; 8];
    let (mut a, wa, la) = one_param(&c, job, &init);
    for s in 0..5 {
        micro_step(&mut a, la, wa, &grad(s));
    }
    let info = a.optimizer_info().unwrap();
    assert_eq!(info.name, "adamw");
    assert_eq!(info.slots, vec!["exp_avg".to_string(), "exp_avg_sq".to_string()]);
    assert_eq!(info.step, 5);
    let params = a.param_read_vec::<f32>(wa).unwrap();
    let mut slots = vec![vec![0f32; 8]; 2];
    for (s, v) in slots.iter_mut().enumerate() {
        a.optimizer_state_read(wa, s as i32, v).unwrap();
    }
    for s in 5..8 {
        micro_step(&mut a, la, wa, &grad(s));
    }
    let want = a.param_read_vec::<f32>(wa).unwrap();

    let (mut b, wb, lb) = one_param(&c, job, &init);
    b.param_write(wb, &params).unwrap();
    for (s, v) in slots.iter().enumerate() {
        b.optimizer_state_write(wb, s as i32, v).unwrap();
    }
    b.set_step(info.step).unwrap();
    for s in 5..8 {
        micro_step(&mut b, lb, wb, &grad(s));
    }
    assert_eq!(b.param_read_vec::<f32>(wb).unwrap(), want);
    let e = b.optimizer_state_read(wb, 2, &mut [0f32; 8]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert_eq!(b.comm_figures().unwrap().bytes_sent, 0);
    // Progress reports change nothing in training.
    b.report(128, 4, Some(0.25)).unwrap();
    b.report(0, 0, None).unwrap();
    assert_eq!(b.param_read_vec::<f32>(wb).unwrap(), want);
}

#[test]
fn the_device_and_the_trainers_stream() {
    let client = client();
    // An unknown device is refused before the script is read.
    let err = Model::create(&client, &ModelOptions::script_text(sgd(0.1, "")).device("tpu"))
        .err()
        .expect("not a device");
    assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
    // The cpu device: the default stream only.
    let mut model = Model::create(&client, &ModelOptions::script_text(sgd(0.1, "")).device("cpu")).unwrap();
    // SAFETY: null is the default stream.
    unsafe { model.set_stream(std::ptr::null_mut()) }.unwrap();
    let mut not_a_stream = 0u8;
    // SAFETY: the cpu device refuses the pointer before it could be used.
    let err = unsafe { model.set_stream(&mut not_a_stream as *mut u8 as *mut std::os::raw::c_void) }
        .err()
        .expect("the cpu device has no streams");
    assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
}

#[test]
fn a_saved_checkpoint_resumes_exactly() {
    let client = client();
    let dir = std::env::temp_dir().join(format!("zerod-rust-ckpt-{}", std::process::id()));
    let job = "return { optimizer = { type = 'adamw', lr = 0.01 } }";
    let (mut a, w, layer) = one_param(&client, job, &[1.0, 2.0, 3.0]);
    for s in 0..4 {
        micro_step(&mut a, layer, w, &[0.1 * s as f32, -0.2, 0.3]);
    }
    a.save(&dir).unwrap();
    for s in 4..7 {
        micro_step(&mut a, layer, w, &[0.1 * s as f32, -0.2, 0.3]);
    }
    let mut want = [0f32; 3];
    a.param_read(w, &mut want).unwrap();
    let (mut b, w2, layer2) = one_param(&client, job, &[9.0, 9.0, 9.0]);
    b.load(&dir).unwrap();
    for s in 4..7 {
        micro_step(&mut b, layer2, w2, &[0.1 * s as f32, -0.2, 0.3]);
    }
    let mut got = [0f32; 3];
    b.param_read(w2, &mut got).unwrap();
    assert_eq!(got, want);
    let err = b.load(dir.join("nothing-here")).err().expect("no checkpoint there");
    assert_eq!(err.status(), Status::Io, "{}", err);
    std::fs::remove_dir_all(&dir).ok();
}
