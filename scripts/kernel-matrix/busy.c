/* A CPU-bound process for icecore to profile inside the test VM.
 * Built with: gcc -static -O1 -fno-omit-frame-pointer */
#include <stdint.h>

static volatile uint64_t sink;

__attribute__((noinline)) static uint64_t leaf(uint64_t x)
{
	for (int i = 0; i < 1000; i++)
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	return x;
}

__attribute__((noinline)) static void middle(void)
{
	sink += leaf(sink);
}

int main(void)
{
	for (;;)
		middle();
}
