/* idemflow — placeholder until the CLI lands in this session. */
#include <stdio.h>
int main(void)
{
    return 0;
}
