// The second fat binary of lazy_main.cu's program.
__global__ void add_ten(int *v) { *v += 10; }

void launch_other(int *v) { add_ten<<<1, 1>>>(v); }
