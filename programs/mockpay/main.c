/* mockpay — the mock payment provider (a real HTTP server); grows with the
 * GATEWAY issue. */
#include <stdio.h>

int main(void)
{
    fputs("mockpay: not implemented yet\n", stderr);
    return 2;
}
