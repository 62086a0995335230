#include <stdio.h>
__attribute__((noinline)) static int leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) int work(int x) { return leaf(x) + leaf(x + 1); }
int main(int argc, char **argv) { printf("%d\n", work(argc)); return 0; }
