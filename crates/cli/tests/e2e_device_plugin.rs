//! `cumux device-plugin` against a kubelet stand-in that speaks the kubelet's
//! real gRPC device-plugin API over unix sockets: the plugin registers, lists
//! the server's memory (or shares of its GPUs) as units, and for an
//! allocation lists a tenant on the cumux server whose token, socket and
//! driver the container gets; a program run with that token sees the units'
//! memory as its device.

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{tenant_program, wait_bounded, ServerProc, TempDir, CUMUX};
use cumux_cli::device_plugin::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use cumux_cli::device_plugin::podresources::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use cumux_cli::device_plugin::unix_channel;
use cumux_cli::device_plugin::v1beta1::device_plugin_client::DevicePluginClient;
use cumux_cli::device_plugin::v1beta1::registration_server::{Registration, RegistrationServer};
use cumux_cli::device_plugin::v1beta1::*;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// The kubelet's registration service: hands each request to the test.
struct Kubelet(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(
        &self,
        request: tonic::Request<RegisterRequest>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(Empty {}))
    }
}

/// The kubelet's pod-resources service: the pod the test says there is,
/// holding these units of this resource.
#[derive(Clone, Default)]
struct Pods(Arc<Mutex<(String, Vec<String>)>>);

#[tonic::async_trait]
impl PodResourcesLister for Pods {
    async fn list(
        &self,
        _: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        let (resource, ids) = self.0.lock().unwrap().clone();
        let pod = PodResources {
            name: "trainer".into(),
            namespace: "default".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: resource,
                    device_ids: ids,
                }],
            }],
        };
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: vec![pod],
        }))
    }
}

/// Kills the plugin at the end of the test, however it ends.
struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The kubelet's side: its registration and pod-resources services on unix
/// sockets in a folder of its own, and what registered.
struct StandIn {
    runtime: tokio::runtime::Runtime,
    registered: mpsc::UnboundedReceiver<RegisterRequest>,
    pods: Pods,
    dir: TempDir,
}

impl StandIn {
    fn start(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (tx, registered) = mpsc::unbounded_channel();
        let listener = runtime
            .block_on(async { tokio::net::UnixListener::bind(dir.0.join("kubelet.sock")) })
            .unwrap();
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(Kubelet(tx)))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let pods = Pods::default();
        let listener = runtime
            .block_on(async { tokio::net::UnixListener::bind(dir.0.join("pod-resources.sock")) })
            .unwrap();
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(pods.clone()))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        StandIn {
            runtime,
            registered,
            pods,
            dir,
        }
    }

    /// `cumux device-plugin` for `server` with `options`, registering here.
    fn plugin(&self, server: &ServerProc, options: &[&str]) -> Plugin {
        Plugin(
            Command::new(CUMUX)
                .args(["device-plugin", "--server", &server.address])
                .args(options)
                .arg("--kubelet-dir")
                .arg(&self.dir.0)
                .args([
                    "--driver-dir",
                    "/opt/cumux-driver",
                    "--gc-interval",
                    "300ms",
                ])
                .arg("--pod-resources")
                .arg(self.dir.0.join("pod-resources.sock"))
                .stdout(Stdio::null())
                .spawn()
                .expect("cumux device-plugin starts"),
        )
    }
}

/// The `total` a tenant's `quota_probe` run with `token` sees.
fn total_seen(server: &ServerProc, token: &str) -> Option<u64> {
    let probe = tenant_program("quota_probe");
    let child = server
        .command(&probe, &[])
        .env("CUMUX_TOKEN", token)
        .spawn()
        .unwrap();
    let out = wait_bounded(child, Duration::from_secs(300));
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix("total "))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
}

/// What the plugin registered with the kubelet.
async fn registration(
    registered: &mut mpsc::UnboundedReceiver<RegisterRequest>,
) -> RegisterRequest {
    tokio::time::timeout(Duration::from_secs(60), registered.recv())
        .await
        .expect("the plugin registers")
        .unwrap()
}

/// A container's environment, as the plugin answered it.
fn envs_of(container: &ContainerAllocateResponse) -> HashMap<&str, &str> {
    container
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// The container's answer to an allocation of `ids`.
async fn allocate(
    client: &mut DevicePluginClient<tonic::transport::Channel>,
    ids: &[&str],
) -> ContainerAllocateResponse {
    let request = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.iter().map(|id| id.to_string()).collect(),
        }],
    };
    let mut answer = client.allocate(request).await.unwrap().into_inner();
    answer.container_responses.remove(0)
}

#[test]
fn a_pod_gets_a_tenant_with_its_share() {
    let server = ServerProc::start_with_config("plugin", Some("allow_unknown = false\n"));
    let stand_in = StandIn::start("plugin-kubelet");
    // The pod that will be given units 2 and 3.
    *stand_in.pods.0.lock().unwrap() = (
        "cumux.io/gpu-memory".into(),
        vec!["gpu0-2".into(), "gpu0-3".into()],
    );
    let plugin = stand_in.plugin(&server, &["--unit", "512M"]);
    let StandIn {
        runtime,
        mut registered,
        pods,
        dir: kubelet_dir,
    } = stand_in;

    runtime.block_on(async {
        let request = registration(&mut registered).await;
        assert_eq!(request.version, "v1beta1");
        assert_eq!(request.endpoint, "cumux.sock");
        assert_eq!(request.resource_name, "cumux.io/gpu-memory");

        let plugin_socket = kubelet_dir.0.join("cumux.sock");
        let channel = unix_channel(plugin_socket)
            .await
            .expect("the plugin answers");
        let mut client = DevicePluginClient::new(channel);
        // 2 GiB of the CPU device in 512 MiB units, all healthy.
        let mut devices = client.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = devices.message().await.unwrap().expect("a device list");
        let ids: Vec<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["gpu0-0", "gpu0-1", "gpu0-2", "gpu0-3"]);
        assert!(first.devices.iter().all(|d| d.health == "Healthy"));

        // A unit it does not offer is refused.
        let bad = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["gpu7-0".into()],
            }],
        };
        let refused = client.allocate(bad).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");

        let container = allocate(&mut client, &["gpu0-2", "gpu0-3"]).await;
        let envs = envs_of(&container);
        assert!(envs["CUMUX_TENANT"].starts_with("pod-"), "{envs:?}");
        assert_eq!(envs["CUMUX_TOKEN"].len(), 64, "{envs:?}");
        assert_eq!(envs["CUMUX_SERVER"], "unix:/run/cumux/s.sock");
        assert_eq!(envs["LD_LIBRARY_PATH"], "/usr/local/cumux/lib");
        let mounts: Vec<(&str, &str)> = container
            .mounts
            .iter()
            .map(|m| (m.host_path.as_str(), m.container_path.as_str()))
            .collect();
        let socket_dir = server.dir.0.display().to_string();
        assert!(mounts.contains(&(&socket_dir, "/run/cumux")), "{mounts:?}");
        assert!(
            mounts.contains(&("/opt/cumux-driver", "/usr/local/cumux/lib")),
            "{mounts:?}"
        );

        // The container's program, with its token: the units' memory is its device.
        let token = envs["CUMUX_TOKEN"].to_string();
        assert_eq!(total_seen(&server, &token), Some(1 << 30));

        // The pod ends: its tenant goes, and its token with it.
        pods.0.lock().unwrap().1.clear();
        let probe = tenant_program("quota_probe");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let child = server
                .command(&probe, &[])
                .env("CUMUX_TOKEN", &token)
                .spawn()
                .unwrap();
            let out = wait_bounded(child, Duration::from_secs(300));
            if out.code() != Some(0) {
                assert!(out.stderr.contains("token"), "{}", out.describe());
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the tenant outlived its pod"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    drop(plugin);
}

/// `--offer share`: each GPU in `--shares` units, each that part of its
/// memory and, as the tenant's weight, of its time.
#[test]
fn a_pod_given_shares_gets_that_part_of_the_gpu() {
    let server = ServerProc::start_with_config("plugin-share", Some("allow_unknown = false\n"));
    let stand_in = StandIn::start("plugin-share-kubelet");
    *stand_in.pods.0.lock().unwrap() = (
        "cumux.io/gpu-share".into(),
        vec!["gpu0-0".into(), "gpu0-1".into()],
    );
    let plugin = stand_in.plugin(&server, &["--offer", "share", "--shares", "4"]);
    let StandIn {
        runtime,
        mut registered,
        dir: kubelet_dir,
        ..
    } = stand_in;
    runtime.block_on(async {
        let request = registration(&mut registered).await;
        assert_eq!(request.endpoint, "cumux-gpu-share.sock");
        assert_eq!(request.resource_name, "cumux.io/gpu-share");
        let channel = unix_channel(kubelet_dir.0.join("cumux-gpu-share.sock"))
            .await
            .expect("the plugin answers");
        let mut client = DevicePluginClient::new(channel);
        let mut devices = client.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = devices.message().await.unwrap().expect("a device list");
        assert_eq!(first.devices.len(), 4, "{first:?}");

        let container = allocate(&mut client, &["gpu0-0", "gpu0-1"]).await;
        let envs = envs_of(&container);
        // Two of four shares of the 2 GiB device: 1 GiB, and weight 2.
        assert_eq!(total_seen(&server, envs["CUMUX_TOKEN"]), Some(1 << 30));
        let status = Command::new(CUMUX)
            .args(["status", "--json", "--server", &server.address])
            .output()
            .unwrap();
        assert!(status.status.success(), "{status:?}");
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        let tenant = status["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == envs["CUMUX_TENANT"])
            .unwrap_or_else(|| panic!("no tenant {} in {status}", envs["CUMUX_TENANT"]));
        assert_eq!(tenant["weight"], 2, "{tenant}");
    });
    drop(plugin);
}
