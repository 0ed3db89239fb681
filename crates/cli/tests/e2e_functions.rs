//! Serverless GPU functions end to end: a real `cumux serve --device cpu
//! --functions` process and real HTTP requests (HTTP/1.1 and HTTP/2) with
//! hand-written PTX kernels: register, invoke, compose, bad plans refused at
//! their place, 413/401/403, multi-dimensional inputs and outputs, a
//! faulting kernel failing only its invocation,
//! scratch read as zeros, a deadline, one tenant's invocations side by side,
//! the `cumux fn` commands and the OpenAPI document.

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{config_file, e2e_device, lines_of, listening_line, TempDir, CUMUX};
use cumux_cli::fn_client::{FnClient, Reply};
use serde_json::{json, Value};

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef00";
/// A tenant with a 1 MiB memory quota.
const CAROL: &str = "carol-token-0123456789abcdef";

fn ptx() -> String {
    let path = cumux_testkit::workspace_root().join("tests/functions/kernels.ptx");
    std::fs::read_to_string(path).expect("the test kernels")
}

/// A `cumux serve --device cpu --functions 127.0.0.1:0` child (the device
/// `CUMUX_E2E_DEVICE` names: `worker-cpu` runs the lanes' sessions in worker
/// processes, the GPU path) with tenants alice, bob and carol; killed at drop.
struct FnServer {
    child: Child,
    url: String,
    /// The line it printed once it listened.
    line: String,
    dir: TempDir,
}

impl FnServer {
    fn start(extra: &[&str]) -> FnServer {
        let dir = TempDir::new("functions");
        let config = config_file(
            &dir,
            &format!(
                "[tenants.alice]\ntoken = \"{ALICE}\"\n[tenants.bob]\ntoken = \"{BOB}\"\n\
                 [tenants.carol]\ntoken = \"{CAROL}\"\nmemory_quota = \"1M\"\n"
            ),
        );
        let log = std::fs::File::create(dir.0.join("server.log")).unwrap();
        let mut child = Command::new(CUMUX)
            .args(["serve", "--device", &e2e_device(), "--memory", "1G"])
            .args(["--functions", "127.0.0.1:0"])
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(format!("unix:{}", dir.0.join("s.sock").display()))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("cumux serve starts");
        let line = listening_line(&lines_of(child.stdout.take().unwrap()));
        let url = line
            .split("functions on ")
            .nth(1)
            .and_then(|rest| rest.split("/v1/functions").next())
            .unwrap_or_else(|| panic!("no functions address in {line:?}"))
            .to_string();
        FnServer {
            child,
            url,
            line,
            dir,
        }
    }

    fn client(&self, token: Option<&str>) -> FnClient {
        FnClient::new(&self.url, token, false).unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("server.log")).unwrap_or_default()
    }
}

impl Drop for FnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// vadd then scale in place: c = (a + b) * k.
fn vadd_plan() -> Value {
    json!({
        "inputs": [{"name": "a", "dtype": "f32"}, {"name": "b", "dtype": "f32", "elements": "a"}],
        "params": [{"name": "k", "dtype": "f32", "default": 1}],
        "outputs": [{"name": "c", "dtype": "f32", "elements": "a"}],
        "launches": [
            {"kernel": "vadd", "grid": "cdiv(a, 64)", "block": 64,
             "args": [{"buffer": "a"}, {"buffer": "b"}, {"buffer": "c"}, {"u32": "a"}]},
            {"kernel": "scale", "grid": "cdiv(a, 64)", "block": [64],
             "args": [{"buffer": "c"}, {"buffer": "c"}, {"f32": "k"}, {"u32": "a"}]}
        ]
    })
}

fn register(client: &FnClient, name: &str, plan: Value) -> Reply {
    let body = json!({ "plan": plan, "module": ptx() });
    client
        .json("PUT", &format!("/v1/functions/{name}?device=cpu"), &body)
        .unwrap()
}

fn invoke(client: &FnClient, name: &str, body: Value) -> Reply {
    client
        .json("POST", &format!("/v1/functions/{name}/invoke"), &body)
        .unwrap()
}

fn floats(reply: &Reply, output: &str) -> Vec<f64> {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let json = reply.json();
    json["outputs"][output]["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no output {output} in {json}"))
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

fn error(reply: &Reply, status: u16) -> String {
    let json = reply.json();
    assert_eq!(reply.status, status, "{json}");
    json["error"].as_str().unwrap_or_default().to_string()
}

#[test]
fn register_invoke_and_compose_give_right_results() {
    let server = FnServer::start(&[]);
    let alice = server.client(Some(ALICE));
    let r = register(&alice, "vadd", vadd_plan());
    assert_eq!(r.status, 200, "{}\n{}", r.json(), server.log());
    assert_eq!(r.json()["backend"], "cpu");

    // JSON in, JSON out; the parameter's default, then a value.
    let a: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..100).map(|i| (2 * i) as f32).collect();
    let out = floats(
        &invoke(&alice, "vadd", json!({"inputs": {"a": a, "b": b}})),
        "c",
    );
    assert_eq!(out, (0..100).map(|i| (3 * i) as f64).collect::<Vec<_>>());
    let out = floats(
        &invoke(
            &alice,
            "vadd",
            json!({"inputs": {"a": a, "b": b}, "params": {"k": 0.5}}),
        ),
        "c",
    );
    assert_eq!(out[10], 15.0);

    // safetensors in and out, over HTTP/2 too.
    for http2 in [false, true] {
        let client = FnClient::new(&server.url, Some(ALICE), http2).unwrap();
        let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        let (ab, bb) = (bytes(&a), bytes(&b));
        let views = vec![
            (
                "a",
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![100], &ab)
                    .unwrap(),
            ),
            (
                "b",
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![100], &bb)
                    .unwrap(),
            ),
        ];
        let meta = std::collections::HashMap::from([("k".to_string(), "2".to_string())]);
        let body = safetensors::serialize(views, Some(meta)).unwrap();
        let reply = client
            .request(
                "POST",
                "/v1/functions/vadd/invoke",
                Some("application/x-safetensors"),
                None,
                body,
            )
            .unwrap();
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.content_type, "application/x-safetensors");
        let st = safetensors::SafeTensors::deserialize(&reply.body).unwrap();
        let c = st.tensor("c").unwrap();
        let c: Vec<f32> = c
            .data()
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(c[7], 42.0, "http2 {http2}");
    }

    // A composition: vadd into a scratch buffer on the device, then scale
    // it into the output: out = (x + y) * k * m.
    let compose = json!({
        "inputs": [{"name": "x", "dtype": "f32"}, {"name": "y", "dtype": "f32"}],
        "params": [{"name": "m", "dtype": "f32"}],
        "outputs": [{"name": "out", "dtype": "f32", "elements": "x"}],
        "scratch": [{"name": "sum", "dtype": "f32", "elements": "x"}],
        "launches": [
            {"call": "vadd", "bind": {"a": "x", "b": "y", "c": "sum"}, "params": {"k": "m * 2"}},
            {"repeat": 2, "launches": [
                {"kernel": "scale", "grid": "cdiv(x, 32)", "block": 32,
                 "args": [{"buffer": "sum"}, {"buffer": "out"}, {"f32": "m"}, {"u32": "x"}]}
            ]}
        ]
    });
    let r = register(&alice, "pipeline", compose);
    assert_eq!(r.status, 200, "{}", r.json());
    let described = alice
        .request("GET", "/v1/functions/pipeline", None, None, Vec::new())
        .unwrap();
    assert_eq!(described.status, 200);
    assert_eq!(
        described.json()["inputs"],
        json!([{"name": "x", "dtype": "f32"}, {"name": "y", "dtype": "f32"}])
    );
    assert_eq!(described.json()["plan"]["launches"][0]["call"], "vadd");
    let out = floats(
        &invoke(
            &alice,
            "pipeline",
            json!({"inputs": {"x": [1, 2, 3], "y": [10, 20, 30]}, "params": {"m": 3}}),
        ),
        "out",
    );
    assert_eq!(out, [11.0 * 6.0 * 3.0, 22.0 * 18.0, 33.0 * 18.0]);

    let list = alice
        .request("GET", "/v1/functions", None, None, Vec::new())
        .unwrap();
    let names: Vec<String> = list.json()["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["pipeline", "vadd"]);
    // A function another calls stays until its caller goes.
    let r = alice
        .request("DELETE", "/v1/functions/vadd", None, None, Vec::new())
        .unwrap();
    assert!(error(&r, 409).contains("\"pipeline\" calls \"vadd\""));
    for name in ["pipeline", "vadd"] {
        let r = alice
            .request(
                "DELETE",
                &format!("/v1/functions/{name}"),
                None,
                None,
                Vec::new(),
            )
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.json());
    }
    let r = invoke(&alice, "vadd", json!({}));
    assert_eq!(r.status, 404);
}

/// A function of two-dimensional tensors: sum = x + y, and one value per row
/// of x in rows; x's rows are `cols` long, y has x's shape.
fn grid_plan() -> Value {
    json!({
        "inputs": [{"name": "x", "dtype": "f32", "shape": [null, "cols"]},
                   {"name": "y", "dtype": "f32", "shape": ["x.shape[0]", "x.shape[1]"]}],
        "params": [{"name": "cols", "dtype": "u32", "default": 3}],
        "outputs": [{"name": "sum", "dtype": "f32", "shape": ["x.shape[0]", "cols"]},
                    {"name": "rows", "dtype": "f32", "shape": ["x.shape[-2]", 1]}],
        "launches": [
            {"kernel": "vadd", "grid": "cdiv(x, 64)", "block": 64,
             "args": [{"buffer": "x"}, {"buffer": "y"}, {"buffer": "sum"}, {"u32": "x"}]},
            {"kernel": "fill", "grid": 1, "block": 64,
             "args": [{"buffer": "rows"}, {"f32": 2.5}, {"u32": "x.shape[0]"}]}
        ]
    })
}

#[test]
fn outputs_have_the_shapes_their_plan_gives_and_inputs_are_checked_against_theirs() {
    let server = FnServer::start(&[]);
    let alice = server.client(Some(ALICE));
    let r = register(&alice, "grid", grid_plan());
    assert_eq!(r.status, 200, "{}\n{}", r.json(), server.log());
    assert_eq!(
        r.json()["inputs"][0],
        json!({"name": "x", "dtype": "f32", "shape": [null, "cols"]})
    );
    assert_eq!(
        r.json()["outputs"][0]["shape"],
        json!(["x.shape[0]", "cols"])
    );

    // JSON: nested lists in, nested lists out, with their shapes.
    let body = json!({"inputs": {"x": [[1, 2, 3], [4, 5, 6]], "y": [[10, 20, 30], [40, 50, 60]]}});
    let reply = invoke(&alice, "grid", body);
    assert_eq!(reply.status, 200, "{}", reply.json());
    let out = &reply.json()["outputs"];
    assert_eq!(out["sum"]["shape"], json!([2, 3]));
    assert_eq!(
        out["sum"]["data"],
        json!([[11.0, 22.0, 33.0], [44.0, 55.0, 66.0]])
    );
    assert_eq!(out["rows"]["shape"], json!([2, 1]));
    assert_eq!(out["rows"]["data"], json!([[2.5], [2.5]]));

    // safetensors: the shapes in the answer's header.
    let xs: Vec<f32> = (1..=8).map(|v| v as f32).collect();
    let ys = vec![1f32; 8];
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let (xb, yb) = (bytes(&xs), bytes(&ys));
    fn view(b: &[u8]) -> safetensors::tensor::TensorView<'_> {
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 4], b).unwrap()
    }
    let meta = std::collections::HashMap::from([("cols".to_string(), "4".to_string())]);
    let st_body =
        safetensors::serialize(vec![("x", view(&xb)), ("y", view(&yb))], Some(meta)).unwrap();
    let reply = alice
        .request(
            "POST",
            "/v1/functions/grid/invoke",
            Some("application/x-safetensors"),
            None,
            st_body,
        )
        .unwrap();
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let st = safetensors::SafeTensors::deserialize(&reply.body).unwrap();
    let sum = st.tensor("sum").unwrap();
    assert_eq!(sum.shape(), [2, 4]);
    assert_eq!(&sum.data()[28..32], &9f32.to_le_bytes());
    assert_eq!(st.tensor("rows").unwrap().shape(), [2, 1]);

    // Inputs of another rank, size or dtype than the plan says: 400, naming the input.
    let e = error(
        &invoke(
            &alice,
            "grid",
            json!({"inputs": {"x": [1, 2, 3], "y": [1, 2, 3]}}),
        ),
        400,
    );
    assert_eq!(
        e,
        r#"inputs[0].shape: input "x" has 1 dimensions [3], the plan says 2"#
    );
    let e = error(
        &invoke(
            &alice,
            "grid",
            json!({"inputs": {"x": [[1, 2, 3]], "y": [[1, 2, 3]]}, "params": {"cols": 2}}),
        ),
        400,
    );
    assert_eq!(
        e,
        r#"inputs[0].shape[1]: size mismatch: input "x" has 3 there (shape [1, 3]), the plan says cols = 2"#
    );
    let e = error(
        &invoke(
            &alice,
            "grid",
            json!({"inputs": {"x": [[1, 2, 3]], "y": [[1, 2, 3], [4, 5, 6]]}}),
        ),
        400,
    );
    assert_eq!(
        e,
        r#"inputs[1].shape[0]: size mismatch: input "y" has 2 there (shape [2, 3]), the plan says x.shape[0] = 1"#
    );
    let e = error(
        &invoke(
            &alice,
            "grid",
            json!({"inputs": {"x": {"dtype": "i32", "data": [[1, 2, 3]]}, "y": [[1, 2, 3]]}}),
        ),
        400,
    );
    assert_eq!(e, "inputs.x: dtype i32, the function takes f32");

    // A plan whose shapes are wrong is refused at registration, at its place.
    let mut bad = grid_plan();
    bad["outputs"][0]["shape"] = json!(["x.shape[2]", "cols"]);
    let e = error(&register(&alice, "bad", bad), 400);
    assert_eq!(
        e,
        r#"outputs[0].shape[0]: x.shape[2] is out of range: input "x" has 2 dimensions (inputs[0].shape)"#
    );
    let mut bad = grid_plan();
    bad["outputs"][1]["shape"] = json!(["rows_of_x"]);
    let e = error(&register(&alice, "bad", bad), 400);
    assert_eq!(e, r#"outputs[1].shape[0]: unknown name "rows_of_x""#);
}

#[test]
fn bad_plans_are_refused_with_their_place() {
    let server = FnServer::start(&[]);
    let alice = server.client(Some(ALICE));
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut plan = vadd_plan();
        edit(&mut plan);
        error(&register(&alice, "bad", plan), 400)
    };
    assert_eq!(
        with(&|p| p["launches"][1]["args"][1] = json!({"buffer": "tmp"})),
        "launches[1].args[1]: unknown buffer \"tmp\""
    );
    assert_eq!(
        with(&|p| p["launches"][0]["args"][3] = json!({"f64": "a"})),
        "launches[0].args[3]: size mismatch: a f64 scalar is 8 bytes, parameter 3 of kernel \"vadd\" has 4"
    );
    assert_eq!(
        with(&|p| {
            p["launches"][1]["args"].as_array_mut().unwrap().pop();
        }),
        "launches[1].args: 3 arguments for kernel \"scale\", which takes 4"
    );
    let grid = with(&|p| p["launches"][0]["grid"] = json!([1, 70000]));
    assert!(
        grid.starts_with("launches[0].grid[1]: 70000 is not within the device's 1..="),
        "{grid}"
    );
    let block = with(&|p| p["launches"][1]["block"] = json!(4096));
    assert!(
        block.starts_with("launches[1].block[0]: 4096 is not within"),
        "{block}"
    );
    assert_eq!(
        with(&|p| p["launches"][0]["kernel"] = json!("vsub")),
        "launches[0].kernel: the module has no kernel \"vsub\" (it has vadd, scale, fill, copy, oob, spin, busy)"
    );
    assert_eq!(
        with(&|p| p["outputs"][0]["elements"] = json!("a +")),
        "outputs[0].elements: unexpected end"
    );
    let field = with(&|p| p["launches"][0]["grdi"] = json!(1));
    assert!(
        field.starts_with("launches[0].grdi: unknown field `grdi`"),
        "{field}"
    );
    // Placement and query parameters the server cannot honour.
    let body = json!({"plan": vadd_plan(), "module": ptx()});
    let r = alice
        .json("PUT", "/v1/functions/bad?device=gpu", &body)
        .unwrap();
    assert_eq!(
        error(&r, 400),
        "device: this server serves the tenant no GPU"
    );
    let r = alice
        .json("PUT", "/v1/functions/bad?device=tpu", &body)
        .unwrap();
    assert_eq!(error(&r, 400), "device: \"tpu\" is not auto, gpu or cpu");
    let r = alice
        .json("PUT", "/v1/functions/bad?devise=cpu", &body)
        .unwrap();
    assert!(error(&r, 400).starts_with("query: unknown parameter \"devise\""));
    let r = alice
        .json("PUT", "/v1/functions/no%20spaces", &body)
        .unwrap();
    assert!(error(&r, 400).starts_with("name: \"no spaces\" is not a function name"));
    // A bad module, and an input whose size the plan contradicts.
    let r = alice
        .json(
            "PUT",
            "/v1/functions/bad?device=cpu",
            &json!({"plan": vadd_plan(), "module": "not ptx"}),
        )
        .unwrap();
    assert!(error(&r, 400).starts_with("module: the device cannot load it"));
    assert_eq!(register(&alice, "vadd", vadd_plan()).status, 200);
    let r = invoke(
        &alice,
        "vadd",
        json!({"inputs": {"a": [1, 2, 3], "b": [1, 2]}}),
    );
    assert_eq!(
        error(&r, 400),
        "inputs[1].elements: size mismatch: input \"b\" has 2 elements, the plan says a = 3"
    );
    let r = invoke(
        &alice,
        "vadd",
        json!({"inputs": {"a": [1], "b": [1]}, "params": {"q": 1}}),
    );
    assert_eq!(
        error(&r, 400),
        "params.q: the function has no parameter \"q\""
    );
    // Nothing was registered by the refusals.
    let list = alice
        .request("GET", "/v1/functions", None, None, Vec::new())
        .unwrap();
    assert_eq!(list.json()["functions"].as_array().map(Vec::len), Some(1));
}

#[test]
fn limits_tokens_and_tenants() {
    let server = FnServer::start(&["--functions-max-body", "64K"]);
    let alice = server.client(Some(ALICE));
    assert_eq!(register(&alice, "vadd", vadd_plan()).status, 200);

    // Oversize input: 413.
    let big: Vec<f32> = vec![1.0; 20_000];
    let r = invoke(&alice, "vadd", json!({"inputs": {"a": big, "b": big}}));
    assert!(error(&r, 413).contains("over this server's limit of 65536 bytes"));

    // No token, an unknown one: 401.
    let r = invoke(&server.client(None), "vadd", json!({}));
    assert!(error(&r, 401).contains("Authorization: Bearer"));
    let r = invoke(
        &server.client(Some("no-such-token-0123456789")),
        "vadd",
        json!({}),
    );
    assert_eq!(r.status, 401);

    // Another tenant's function: 403 to invoke, replace, describe or remove.
    let bob = server.client(Some(BOB));
    let r = invoke(&bob, "vadd", json!({"inputs": {"a": [1], "b": [2]}}));
    assert_eq!(error(&r, 403), "function \"vadd\" is another tenant's");
    assert_eq!(register(&bob, "vadd", vadd_plan()).status, 403);
    for method in ["GET", "DELETE"] {
        let r = bob
            .request(method, "/v1/functions/vadd", None, None, Vec::new())
            .unwrap();
        assert_eq!(r.status, 403, "{method}");
    }
    let list = bob
        .request("GET", "/v1/functions", None, None, Vec::new())
        .unwrap();
    assert_eq!(list.json(), json!({"functions": []}));
    // Alice's still works.
    let out = floats(
        &invoke(&alice, "vadd", json!({"inputs": {"a": [1], "b": [2]}})),
        "c",
    );
    assert_eq!(out, [3.0]);
}

#[test]
fn a_function_shared_with_a_tenant_runs_in_that_tenants_own_session() {
    let server = FnServer::start(&[]);
    let (alice, bob, carol) = (
        server.client(Some(ALICE)),
        server.client(Some(BOB)),
        server.client(Some(CAROL)),
    );
    let share = |plan: Value| {
        let body = json!({ "plan": plan, "module": ptx(), "invokers": ["bob"] });
        alice
            .json("PUT", "/v1/functions/vadd?device=cpu", &body)
            .unwrap()
    };
    assert_eq!(share(vadd_plan()).status, 200);
    let run = |client: &FnClient| {
        invoke(
            client,
            "vadd",
            json!({"inputs": {"a": [1, 2], "b": [3, 4]}}),
        )
    };
    assert_eq!(floats(&run(&bob), "c"), [4.0, 6.0]);
    assert_eq!(
        error(&run(&carol), 403),
        "function \"vadd\" is another tenant's"
    );
    // Bob sees it, and may not replace or remove it.
    let listed = bob
        .request("GET", "/v1/functions", None, None, Vec::new())
        .unwrap();
    assert_eq!(listed.json()["functions"][0]["tenant"], "alice");
    assert_eq!(register(&bob, "vadd", vadd_plan()).status, 403);
    let r = bob
        .request("DELETE", "/v1/functions/vadd", None, None, Vec::new())
        .unwrap();
    assert_eq!(r.status, 403);
    // Registered again, bob's lane loads the new module and runs the new plan.
    let mut doubled = vadd_plan();
    doubled["params"][0]["default"] = json!(2);
    assert_eq!(share(doubled).status, 200);
    assert_eq!(floats(&run(&bob), "c"), [8.0, 12.0]);
    // It ran in bob's own session (his tenant's figures), not alice's.
    let sessions = String::from_utf8(
        Command::new(CUMUX)
            .args(["status", "--json", "--server"])
            .arg(format!("unix:{}", server.dir.0.join("s.sock").display()))
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let status: Value = serde_json::from_str(&sessions).unwrap();
    let mut programs: Vec<(String, String)> = status["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["tenant"].as_str().unwrap().into(),
                s["program"].as_str().unwrap().into(),
            )
        })
        .collect();
    programs.sort();
    assert_eq!(
        programs,
        [
            ("alice".to_string(), "cumux-functions (alice)".to_string()),
            ("bob".to_string(), "cumux-functions (bob)".to_string())
        ]
    );
    // Removed, it is gone for bob too.
    let r = alice
        .request("DELETE", "/v1/functions/vadd", None, None, Vec::new())
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(run(&bob).status, 404);
}

#[test]
fn a_fault_fails_one_invocation_and_the_next_works() {
    let server = FnServer::start(&["--metrics", "127.0.0.1:0"]);
    let alice = server.client(Some(ALICE));
    assert_eq!(register(&alice, "vadd", vadd_plan()).status, 200);
    let boom = json!({
        "outputs": [{"name": "x", "dtype": "f32", "elements": 4}],
        "launches": [{"kernel": "oob", "grid": 1, "block": 1, "args": [{"buffer": "x"}]}]
    });
    assert_eq!(register(&alice, "boom", boom).status, 200);
    for _ in 0..2 {
        let r = invoke(&alice, "boom", json!({}));
        assert_eq!(r.status, 500, "{}", r.json());
        assert_eq!(
            r.json()["cuda_error"],
            "CUDA_ERROR_ILLEGAL_ADDRESS",
            "{}",
            r.json()
        );
        assert_eq!(r.json()["code"], 700);
        let out = floats(
            &invoke(
                &alice,
                "vadd",
                json!({"inputs": {"a": [1, 2], "b": [3, 4]}}),
            ),
            "c",
        );
        assert_eq!(out, [4.0, 6.0], "{}", server.log());
    }
    // /metrics counts each function's invocations by status.
    let text = metrics(&server);
    for series in [
        "cumux_function_invocations_total{function=\"boom\",status=\"500\",tenant=\"alice\"} 2",
        "cumux_function_invocations_total{function=\"vadd\",status=\"200\",tenant=\"alice\"} 2",
        "cumux_functions{tenant=\"alice\"} 2",
    ] {
        assert!(text.contains(series), "{series}\n{text}");
    }
    // The lane's session is the tenant's, in the server's own figures.
    assert!(
        text.contains("cumux_tenant_launches_total{tenant=\"alice\"}"),
        "{text}"
    );
}

#[test]
fn a_kernel_past_its_deadline_gets_504_and_the_lane_serves_on() {
    let server = FnServer::start(&[]);
    let alice = server.client(Some(ALICE));
    assert_eq!(register(&alice, "vadd", vadd_plan()).status, 200);
    let spin = json!({
        "outputs": [{"name": "x", "dtype": "f32", "elements": 1}],
        "launches": [{"kernel": "spin", "grid": 1, "block": 1, "args": [{"buffer": "x"}]}]
    });
    assert_eq!(register(&alice, "spin", spin).status, 200);
    let started = std::time::Instant::now();
    let r = alice
        .json(
            "POST",
            "/v1/functions/spin/invoke?deadline_ms=300",
            &json!({}),
        )
        .unwrap();
    assert!(error(&r, 504).contains("deadline"));
    assert!(started.elapsed() < Duration::from_secs(10));
    let out = floats(
        &invoke(&alice, "vadd", json!({"inputs": {"a": [1], "b": [1]}})),
        "c",
    );
    assert_eq!(out, [2.0], "{}", server.log());
    let r = alice
        .json(
            "POST",
            "/v1/functions/vadd/invoke?deadline_ms=soon",
            &json!({}),
        )
        .unwrap();
    assert!(error(&r, 400).starts_with("deadline_ms: \"soon\""));
}

/// The server's `/metrics` text (it was started with `--metrics`).
fn metrics(server: &FnServer) -> String {
    let at = server
        .line
        .split("metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split("/metrics").next())
        .unwrap_or_else(|| panic!("no metrics address in {:?}", server.line));
    let scraper = FnClient::new(&format!("http://{at}"), None, false).unwrap();
    let reply = scraper
        .request("GET", "/metrics", None, None, Vec::new())
        .unwrap();
    String::from_utf8(reply.body).unwrap()
}

/// With `lanes` lanes per device, alice's `spin` (a kernel that never ends,
/// deadline a minute away) runs, then her `vadd` with a 3 s deadline: its
/// reply.
fn vadd_beside_a_spinning_kernel(lanes: &str) -> (Reply, FnServer) {
    // No launch budget: the spin must outlast vadd's deadline.
    let server = FnServer::start(&[
        "--metrics",
        "127.0.0.1:0",
        "--functions-lanes",
        lanes,
        "--launch-budget",
        "0",
    ]);
    let alice = server.client(Some(ALICE));
    assert_eq!(register(&alice, "vadd", vadd_plan()).status, 200);
    let spin = json!({
        "outputs": [{"name": "x", "dtype": "f32", "elements": 1}],
        "launches": [{"kernel": "spin", "grid": 1, "block": 1, "args": [{"buffer": "x"}]}]
    });
    assert_eq!(register(&alice, "spin", spin).status, 200);
    let spinner = server.client(Some(ALICE));
    // Never joined: the server is killed under it at the end.
    std::thread::spawn(move || {
        let _ = spinner.json(
            "POST",
            "/v1/functions/spin/invoke?deadline_ms=60000",
            &json!({}),
        );
    });
    // The spin is on a lane (queued or running) before vadd is sent.
    let on_lane = "cumux_function_lane_jobs{tenant=\"alice\"} 1";
    let mut waited = 0;
    while !metrics(&server).contains(on_lane) {
        assert!(
            waited < 1000,
            "the spin never reached a lane\n{}",
            metrics(&server)
        );
        std::thread::sleep(Duration::from_millis(10));
        waited += 1;
    }
    let reply = alice
        .json(
            "POST",
            "/v1/functions/vadd/invoke?deadline_ms=3000",
            &json!({"inputs": {"a": [1, 2], "b": [3, 4]}}),
        )
        .unwrap();
    (reply, server)
}

#[test]
fn a_tenants_invocations_run_side_by_side_on_its_lanes() {
    // Two lanes: vadd runs on the second while spin holds the first.
    let (reply, server) = vadd_beside_a_spinning_kernel("2");
    assert_eq!(floats(&reply, "c"), [4.0, 6.0], "{}", server.log());
    let text = metrics(&server);
    assert!(
        text.contains("cumux_function_lanes{tenant=\"alice\"} 2"),
        "{text}"
    );
    // One lane: vadd waits behind spin until its own deadline.
    let (reply, server) = vadd_beside_a_spinning_kernel("1");
    assert!(error(&reply, 504).contains("queued"), "{}", server.log());
}

#[test]
fn sigterm_refuses_new_requests_and_lets_running_ones_finish() {
    let mut server = FnServer::start(&["--metrics", "127.0.0.1:0"]);
    let alice = server.client(Some(ALICE));
    let busy = json!({
        "params": [{"name": "n", "dtype": "u32"}],
        "outputs": [{"name": "x", "dtype": "f32", "elements": 1}],
        "launches": [{"kernel": "busy", "grid": 1, "block": 1, "args": [{"buffer": "x"}, {"u32": "n"}]}]
    });
    assert_eq!(register(&alice, "busy", busy).status, 200);
    // How long a million turns take here (the fastest of three runs), for a
    // run of about 6 s: it must outlast the signal (sent once its lane runs
    // it) and the refused request.
    let per_million = (0..3)
        .map(|_| {
            let started = std::time::Instant::now();
            let r = invoke(&alice, "busy", json!({"params": {"n": 2_000_000}}));
            assert_eq!(r.status, 200);
            started.elapsed().as_secs_f64() / 2.0
        })
        .fold(f64::INFINITY, f64::min)
        .max(1e-4);
    let turns = (6.0 / per_million * 1e6).min(4e9) as u64;
    let url = server.url.clone();
    let running = std::thread::spawn(move || {
        let alice = FnClient::new(&url, Some(ALICE), false).unwrap();
        invoke(&alice, "busy", json!({"params": {"n": turns}}))
    });
    // A request whose bytes the server has not read yet when it drains
    // finds its connection closed (an idle one, to the HTTP server): the
    // signal waits until the invocation runs on its lane.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !metrics(&server).contains("cumux_function_lane_jobs{tenant=\"alice\"} 1") {
        assert!(
            std::time::Instant::now() < deadline,
            "the invocation never ran\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    std::thread::sleep(Duration::from_millis(150));
    let r = alice
        .request("GET", "/v1/functions", None, None, Vec::new())
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.log()));
    assert!(error(&r, 503).contains("shutting down"), "{}", server.log());
    let done = running.join().unwrap();
    assert_eq!(
        floats(&done, "x"),
        [turns as f32 as f64],
        "{}",
        server.log()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}\n{}", server.log());
}

#[test]
fn scratch_is_read_as_zeros() {
    let server = FnServer::start(&[]);
    let alice = server.client(Some(ALICE));
    // Copies its scratch out before anything wrote it, then dirties all of
    // it: a later invocation given the same memory (the scratch is the only
    // buffer of its size, so the lane's pool gives it the same one) would
    // see the 7s.
    let leak = json!({
        "params": [{"name": "n", "dtype": "u32"}],
        "outputs": [{"name": "seen", "dtype": "f32", "elements": "n"}],
        "scratch": [{"name": "t", "dtype": "f32", "elements": "n * 4"}],
        "launches": [
            {"kernel": "copy", "grid": "cdiv(n, 64)", "block": 64,
             "args": [{"buffer": "t"}, {"buffer": "seen"}, {"u32": "n"}]},
            {"kernel": "fill", "grid": "cdiv(n * 4, 64)", "block": 64,
             "args": [{"buffer": "t"}, {"f32": 7}, {"u32": "n * 4"}]}
        ]
    });
    let r = register(&alice, "leak", leak);
    assert_eq!(r.status, 200, "{}", r.json());
    for _ in 0..3 {
        let out = floats(
            &invoke(&alice, "leak", json!({"params": {"n": 1000}})),
            "seen",
        );
        assert_eq!(out.len(), 1000);
        assert!(out.iter().all(|v| *v == 0.0), "{out:?}");
    }
}

#[test]
fn the_cli_registers_lists_invokes_and_removes() {
    let server = FnServer::start(&[]);
    let dir = TempDir::new("fn-cli");
    let module = dir.0.join("kernels.ptx");
    std::fs::write(&module, ptx()).unwrap();
    let plan = dir.0.join("plan.json");
    std::fs::write(&plan, vadd_plan().to_string()).unwrap();
    let cumux = |args: &[&str]| {
        let out = Command::new(CUMUX)
            .arg("fn")
            .args(args)
            .env("CUMUX_FUNCTIONS_URL", &server.url)
            .env("CUMUX_TOKEN", ALICE)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = cumux(&[
        "register",
        "vadd",
        "--module",
        module.to_str().unwrap(),
        "--plan",
        plan.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, _) = cumux(&["list"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("\"name\": \"vadd\""), "{out}");
    let (code, out, err) = cumux(&[
        "invoke",
        "vadd",
        "--json",
        r#"{"inputs": {"a": [1, 2], "b": [5, 5]}, "params": {"k": 2}}"#,
    ]);
    assert_eq!(code, Some(0), "{err}");
    let reply: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(reply["outputs"]["c"]["data"], json!([12.0, 14.0]));
    let (code, _, err) = cumux(&[
        "invoke",
        "vadd",
        "--json",
        r#"{"inputs": {"a": [1], "b": [1, 2]}}"#,
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("HTTP 400: inputs[1].elements: size mismatch"),
        "{err}"
    );
    // safetensors in a file, outputs to a file.
    let a: Vec<u8> = [1f32, 2.0].iter().flat_map(|f| f.to_le_bytes()).collect();
    let views = vec![
        (
            "a",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &a).unwrap(),
        ),
        (
            "b",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &a).unwrap(),
        ),
    ];
    let meta = std::collections::HashMap::from([("k".to_string(), "3".to_string())]);
    let data = dir.0.join("in.safetensors");
    std::fs::write(&data, safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
    let out_file = dir.0.join("out.safetensors");
    let (code, _, err) = cumux(&[
        "invoke",
        "vadd",
        "--data",
        data.to_str().unwrap(),
        "--out",
        out_file.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    let bytes = std::fs::read(&out_file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let c: Vec<f32> = st
        .tensor("c")
        .unwrap()
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(c, [6.0, 12.0]);
    // A fat binary (nvcc's, with PTX in it) goes as base64.
    let fatbin =
        cumux_testkit::workspace_root().join("crates/fatbin/tests/fixtures/default.fatbin");
    let scale = dir.0.join("scale.json");
    let plan = json!({
        "inputs": [{"name": "x", "dtype": "f32"}],
        "params": [{"name": "k", "dtype": "f32"}],
        "outputs": [{"name": "y", "dtype": "f32", "elements": "x"}],
        "launches": [
            {"call": "vadd", "bind": {"a": "x", "b": "x", "c": "y"}},
            {"kernel": "scale", "grid": "cdiv(x, 32)", "block": 32,
             "args": [{"buffer": "y"}, {"f32": "k"}, {"i32": "x"}]}
        ]
    });
    std::fs::write(&scale, plan.to_string()).unwrap();
    let (code, out, err) = cumux(&[
        "register",
        "twice",
        "--module",
        fatbin.to_str().unwrap(),
        "--plan",
        scale.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"scale\""), "{out}");
    let (code, out, err) = cumux(&[
        "invoke",
        "twice",
        "--json",
        r#"{"inputs": {"x": [1, 2, 3]}, "params": {"k": 10}}"#,
    ]);
    assert_eq!(code, Some(0), "{err}");
    let reply: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(reply["outputs"]["y"]["data"], json!([20.0, 40.0, 60.0]));
    let (code, _, err) = cumux(&["rm", "twice"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = cumux(&["rm", "vadd"]);
    assert_eq!(code, Some(0), "{err}");
    let (_, out, _) = cumux(&["list"]);
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed, json!({"functions": []}));
}

#[test]
fn the_openapi_document_is_served_and_unknown_paths_are_404() {
    let server = FnServer::start(&[]);
    let anyone = server.client(None);
    let r = anyone
        .request("GET", "/v1/openapi.json", None, None, Vec::new())
        .unwrap();
    assert_eq!(r.status, 200);
    let doc = r.json();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths: BTreeMap<String, Value> = serde_json::from_value(doc["paths"].clone()).unwrap();
    assert!(
        paths.contains_key("/v1/functions/{name}/invoke"),
        "{paths:?}"
    );
    let r = anyone
        .request("GET", "/v2/nothing", None, None, Vec::new())
        .unwrap();
    assert_eq!(r.status, 404);
    let _ = Duration::ZERO;
}
