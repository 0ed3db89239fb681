// Memory pools shared between processes: the parent makes a pool shareable
// as file descriptors, allocates from it and fills the allocation; a child
// gets the pool's descriptor (SCM_RIGHTS) and the pointer's export data (a
// pipe), imports both, checks the values with a kernel and writes its own;
// the parent sees them. Export data of another pool is refused. Where the
// device shares no pools (the attribute is 0), pool creation must be
// refused, and the program says so and passes.
// Prints PASS.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime.h>

#include "check.h"

__global__ void check_and_mark(int *v, int n, int *bad) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    if (v[i] != i * 3) atomicAdd(bad, 1);
    v[i] = -i;
  }
}

static int send_fd(int sock, int fd) {
  char byte = 'P';
  struct iovec io = {&byte, 1};
  char ctl[CMSG_SPACE(sizeof(int))];
  memset(ctl, 0, sizeof ctl);
  struct msghdr msg = {};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof ctl;
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static int recv_fd(int sock) {
  char byte;
  struct iovec io = {&byte, 1};
  char ctl[CMSG_SPACE(sizeof(int))];
  struct msghdr msg = {};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof ctl;
  if (recvmsg(sock, &msg, 0) != 1) return -1;
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

static int child(int sock, int pipe_in) {
  int fd = recv_fd(sock);
  REQUIRE(fd >= 0, "child: no pool descriptor");
  cudaMemPoolPtrExportData data[2];
  REQUIRE(read(pipe_in, data, sizeof data) == (ssize_t)sizeof data, "child: no export data");
  cudaMemPool_t pool;
  CHECK(cudaMemPoolImportFromShareableHandle(&pool, (void *)(long)fd, cudaMemHandleTypePosixFileDescriptor, 0));
  // data[1] is another pool's: refused.
  int *other = nullptr;
  REQUIRE(cudaMemPoolImportPointer((void **)&other, pool, &data[1]) != cudaSuccess,
          "child: another pool's export data was taken");
  cudaGetLastError();
  int *v = nullptr;
  CHECK(cudaMemPoolImportPointer((void **)&v, pool, &data[0]));
  const int n = 1 << 16;
  int *bad;
  CHECK(cudaMalloc(&bad, sizeof(int)));
  CHECK(cudaMemset(bad, 0, sizeof(int)));
  check_and_mark<<<(n + 255) / 256, 256>>>(v, n, bad);
  int got = -1;
  CHECK(cudaMemcpy(&got, bad, sizeof got, cudaMemcpyDeviceToHost));
  REQUIRE(got == 0, "child: %d values differ from the parent's", got);
  CHECK(cudaFree(v));
  CHECK(cudaFree(bad));
  CHECK(cudaMemPoolDestroy(pool));
  printf("child PASS\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3) return child(atoi(argv[1]), atoi(argv[2]));
  int types = 0;
  CHECK(cudaDeviceGetAttribute(&types, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool, spare;
  cudaError_t made = cudaMemPoolCreate(&pool, &props);
  if (!(types & cudaMemHandleTypePosixFileDescriptor)) {
    REQUIRE(made != cudaSuccess, "a shareable pool was made where the attribute says none");
    printf("no shareable pools on this device (as its attribute says)\nPASS\n");
    return 0;
  }
  CHECK(made);
  CHECK(cudaMemPoolCreate(&spare, &props));

  const int n = 1 << 16;
  int *v, *w;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaMallocFromPoolAsync((void **)&v, n * sizeof(int), pool, s));
  CHECK(cudaMallocFromPoolAsync((void **)&w, n * sizeof(int), spare, s));
  static int host[1 << 16];
  for (int i = 0; i < n; i++) host[i] = i * 3;
  CHECK(cudaMemcpyAsync(v, host, sizeof host, cudaMemcpyHostToDevice, s));
  CHECK(cudaStreamSynchronize(s));

  int fd = -1, spare_fd = -1;
  CHECK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
  CHECK(cudaMemPoolExportToShareableHandle(&spare_fd, spare, cudaMemHandleTypePosixFileDescriptor, 0));
  cudaMemPoolPtrExportData data[2];
  CHECK(cudaMemPoolExportPointer(&data[0], v));
  CHECK(cudaMemPoolExportPointer(&data[1], w));

  int socks[2], pipes[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, socks) == 0, "socketpair");
  REQUIRE(pipe(pipes) == 0, "pipe");
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    // A fresh process, as a program's worker would be: exec ourselves.
    char sock_arg[16], pipe_arg[16];
    snprintf(sock_arg, sizeof sock_arg, "%d", socks[1]);
    snprintf(pipe_arg, sizeof pipe_arg, "%d", pipes[0]);
    execl("/proc/self/exe", "pool_ipc", sock_arg, pipe_arg, (char *)nullptr);
    _exit(127);
  }
  REQUIRE(send_fd(socks[0], fd) == 0, "sending the pool's descriptor");
  REQUIRE(write(pipes[1], data, sizeof data) == (ssize_t)sizeof data, "sending the export data");
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)", status);

  CHECK(cudaMemcpy(host, v, sizeof host, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) REQUIRE(host[i] == -i, "the child's write at %d: %d", i, host[i]);
  CHECK(cudaFreeAsync(v, s));
  CHECK(cudaFreeAsync(w, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemPoolDestroy(pool));
  CHECK(cudaMemPoolDestroy(spare));
  close(fd);
  close(spare_fd);
  printf("PASS\n");
  return 0;
}
