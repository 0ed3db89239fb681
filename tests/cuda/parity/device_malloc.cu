// device_malloc: device-side malloc/free and new/delete within the heap set
// by cudaLimitMallocHeapSize: each thread builds a small list, sums it and
// frees it; 12 MiB fit the 16 MiB heap (not the default 8 MiB one), and an
// allocation larger than the heap returns NULL.
#include <cstdio>
#include <cstdlib>

#include "../corpus/check.h"

struct Node {
    int value;
    Node* next;
};

__global__ void lists(int* sums, int* too_big_was_null, int* big_fits)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    Node* head = nullptr;
    for (int k = 0; k <= i % 8; ++k) {
        Node* node = new Node;
        node->value = i * 10 + k;
        node->next = head;
        head = node;
    }
    int* scratch = (int*)malloc(16 * sizeof(int));
    for (int k = 0; k < 16; ++k) scratch[k] = k;
    int sum = scratch[15];
    free(scratch);
    while (head) {
        sum += head->value;
        Node* next = head->next;
        delete head;
        head = next;
    }
    sums[i] = sum;
    if (i == 0) {
        *too_big_was_null = malloc((size_t)1 << 40) == nullptr;
        void* big = malloc((size_t)12 << 20);
        *big_fits = big != nullptr;
        free(big);
    }
}

int main()
{
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 16 << 20));
    size_t heap = 0;
    CHECK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
    if (heap != (16 << 20)) {
        printf("device_malloc: FAIL (heap limit reads %zu)\n", heap);
        return 1;
    }
    const int blocks = 4, threads = 64, n = blocks * threads;
    int *d_sums, *d_null, *d_big;
    CHECK(cudaMalloc(&d_sums, n * sizeof(int)));
    CHECK(cudaMalloc(&d_null, sizeof(int)));
    CHECK(cudaMalloc(&d_big, sizeof(int)));
    for (int round = 0; round < 3; ++round) {
        lists<<<blocks, threads>>>(d_sums, d_null, d_big);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
    }
    int h[n], was_null = 0, big_fits = 0;
    CHECK(cudaMemcpy(h, d_sums, sizeof(h), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&was_null, d_null, sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&big_fits, d_big, sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
        int want = 15;
        for (int k = 0; k <= i % 8; ++k) want += i * 10 + k;
        if (h[i] != want) {
            printf("device_malloc: FAIL (thread %d: got %d expected %d)\n", i, h[i], want);
            return 1;
        }
    }
    if (!big_fits) {
        printf("device_malloc: FAIL (12 MiB did not fit the 16 MiB heap)\n");
        return 1;
    }
    if (!was_null) {
        printf("device_malloc: FAIL (an allocation over the heap was not NULL)\n");
        return 1;
    }
    printf("device_malloc: PASS\n");
    return 0;
}
