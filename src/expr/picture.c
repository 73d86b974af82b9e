/*
 * picture — XPath F&O picture strings: $formatNumber, $formatInteger,
 * $parseInteger and the date/time pictures of $fromMillis/$toMillis.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "expr/expr_int.h"

val *expr_format_datetime(struct ctx *c, double ms, val *picture, val *tz);
val *expr_parse_datetime(struct ctx *c, val *s, val *picture);

val *expr_format_datetime(struct ctx *c, double ms, val *picture, val *tz)
{
    ethrow(c, "D3132", -1, NULL, "date/time pictures are not supported");
}

val *expr_parse_datetime(struct ctx *c, val *s, val *picture)
{
    ethrow(c, "D3132", -1, NULL, "date/time pictures are not supported");
}

val *fn_formatNumber(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    ethrow(c, "D3132", -1, NULL, "not supported");
}

val *fn_formatInteger(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    ethrow(c, "D3132", -1, NULL, "not supported");
}

val *fn_parseInteger(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    ethrow(c, "D3132", -1, NULL, "not supported");
}
