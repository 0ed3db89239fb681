//! `cumux fn register|invoke|list|rm`: the functions API from the command
//! line, as the tenant whose token `--token` or `CUMUX_TOKEN` gives.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use base64::Engine as _;

use crate::fn_client::{FnClient, Reply};

/// Where the functions API is, when `--url` is not given.
pub const URL_ENV: &str = "CUMUX_FUNCTIONS_URL";
/// The tenant's token, when `--token` is not given.
pub const TOKEN_ENV: &str = "CUMUX_TOKEN";

#[derive(Debug, clap::Args)]
pub struct FnOptions {
    /// The functions API: http://HOST:PORT, or https://HOST:PORT trusting what CUMUX_TLS_FINGERPRINT or CUMUX_TLS_CA says (default: $CUMUX_FUNCTIONS_URL).
    #[arg(long)]
    pub url: Option<String>,
    /// The tenant's token (default: $CUMUX_TOKEN).
    #[arg(long)]
    pub token: Option<String>,
    #[command(subcommand)]
    pub command: FnCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum FnCommand {
    /// Register (or replace) a function: a module and its plan.
    Register {
        name: String,
        /// The module: PTX text, a cubin or a fat binary.
        #[arg(long)]
        module: PathBuf,
        /// The plan: a JSON file.
        #[arg(long)]
        plan: PathBuf,
        /// Where to load it: auto (a GPU if the tenant has one), gpu or cpu.
        #[arg(long)]
        device: Option<String>,
        /// Another tenant that may invoke it (repeatable); it runs in that
        /// tenant's own session, on its quota.
        #[arg(long = "invoker")]
        invokers: Vec<String>,
    },
    /// Invoke a function; prints its outputs as JSON (or writes them with --out).
    Invoke {
        name: String,
        /// The request as JSON text: {"inputs": {...}, "params": {...}}.
        #[arg(long, conflicts_with = "data")]
        json: Option<String>,
        /// The request from a file: .safetensors, else JSON.
        #[arg(long)]
        data: Option<PathBuf>,
        /// Write the outputs to this file as safetensors.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The invocation's deadline, in milliseconds.
        #[arg(long)]
        deadline_ms: Option<u64>,
    },
    /// List the tenant's functions.
    List,
    /// Remove a function.
    Rm { name: String },
}

/// The reply's body if it succeeded, else an error with its status and text.
fn ok(reply: Reply) -> Result<Reply> {
    if (200..300).contains(&reply.status) {
        return Ok(reply);
    }
    let json = reply.json();
    let text = json["error"].as_str().map_or_else(
        || String::from_utf8_lossy(&reply.body).into_owned(),
        str::to_string,
    );
    bail!("HTTP {}: {text}", reply.status)
}

fn print_json(reply: &Reply) {
    let json = reply.json();
    println!(
        "{}",
        serde_json::to_string_pretty(&json).unwrap_or_default()
    );
}

pub fn run(options: FnOptions) -> Result<()> {
    let url = options
        .url
        .or_else(|| std::env::var(URL_ENV).ok())
        .with_context(|| format!("where is the functions API? give --url or set {URL_ENV}"))?;
    let token = options.token.or_else(|| std::env::var(TOKEN_ENV).ok());
    let client = FnClient::new(&url, token.as_deref(), false)?;
    match options.command {
        FnCommand::Register {
            name,
            module,
            plan,
            device,
            invokers,
        } => {
            let image = std::fs::read(&module).with_context(|| format!("{}", module.display()))?;
            let plan_text = std::fs::read(&plan).with_context(|| format!("{}", plan.display()))?;
            let plan: serde_json::Value = serde_json::from_slice(&plan_text)
                .with_context(|| format!("{} is not JSON", plan.display()))?;
            let mut body = serde_json::json!({ "plan": plan, "invokers": invokers });
            match String::from_utf8(image) {
                Ok(text) if !text.contains('\0') => body["module"] = text.into(),
                Ok(text) => {
                    body["module_base64"] = base64::engine::general_purpose::STANDARD
                        .encode(text)
                        .into()
                }
                Err(e) => {
                    body["module_base64"] = base64::engine::general_purpose::STANDARD
                        .encode(e.into_bytes())
                        .into()
                }
            }
            let query = device.map_or_else(String::new, |d| format!("?device={d}"));
            print_json(&ok(client.json(
                "PUT",
                &format!("/v1/functions/{name}{query}"),
                &body,
            )?)?);
        }
        FnCommand::Invoke {
            name,
            json,
            data,
            out,
            deadline_ms,
        } => {
            let (content_type, body) = match (json, data) {
                (Some(text), _) => ("application/json", text.into_bytes()),
                (None, Some(path)) => {
                    let bytes =
                        std::fs::read(&path).with_context(|| format!("{}", path.display()))?;
                    match path.extension().is_some_and(|e| e == "safetensors") {
                        true => (cumux_functions::tensors::SAFETENSORS, bytes),
                        false => ("application/json", bytes),
                    }
                }
                (None, None) => ("application/json", b"{}".to_vec()),
            };
            let accept = match out {
                Some(_) => cumux_functions::tensors::SAFETENSORS,
                None => "application/json",
            };
            let query = deadline_ms.map_or_else(String::new, |ms| format!("?deadline_ms={ms}"));
            let path = format!("/v1/functions/{name}/invoke{query}");
            let reply =
                ok(client.request("POST", &path, Some(content_type), Some(accept), body)?)?;
            match out {
                Some(file) => std::fs::write(&file, &reply.body)
                    .with_context(|| format!("{}", file.display()))?,
                None => print_json(&reply),
            }
        }
        FnCommand::List => print_json(&ok(client.request(
            "GET",
            "/v1/functions",
            None,
            None,
            Vec::new(),
        )?)?),
        FnCommand::Rm { name } => print_json(&ok(client.request(
            "DELETE",
            &format!("/v1/functions/{name}"),
            None,
            None,
            Vec::new(),
        )?)?),
    }
    Ok(())
}
