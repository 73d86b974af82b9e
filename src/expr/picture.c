/*
 * picture — XPath F&O picture strings: $formatInteger and the date/time
 * pictures of $fromMillis/$now/$toMillis (a port of jsonata-js datetime.js).
 *
 * Formatting works on arrays of code points so that non-ASCII digit
 * families and separators behave as in the reference.  Not supported yet:
 * $formatNumber and $parseInteger (they raise D3137 with an explanation;
 * see docs/expr.md); $toMillis pictures support decimal components, names
 * and am/pm only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "expr/expr_int.h"

#define ARG(i) (n > (i) ? a[i] : NULL)
#define CP_MAX 512

val *expr_format_datetime(struct ctx *c, double ms, val *picture, val *tz);
val *expr_parse_datetime(struct ctx *c, val *s, val *picture);

enum { P_DECIMAL, P_LETTERS, P_ROMAN, P_WORDS, P_SEQUENCE };
enum { C_LOWER, C_UPPER, C_TITLE };

struct sep {
    int position;
    uint32_t ch;
};

struct ifmt {
    int primary, tcase, ordinal;
    uint32_t zero;
    int mandatory, optional;
    int regular;
    struct sep seps[32];
    int nseps;
    int regpos;
    uint32_t regch;
};

struct cps {
    uint32_t v[CP_MAX];
    int n;
};

static void cps_add(struct cps *s, uint32_t c)
{
    if (s->n < CP_MAX)
        s->v[s->n++] = c;
}
static void cps_str(struct cps *s, const char *t)
{
    while (*t)
        cps_add(s, (unsigned char)*t++);
}
static void cps_insert(struct cps *s, int pos, uint32_t c)
{
    if (s->n >= CP_MAX || pos < 0 || pos > s->n)
        return;
    memmove(&s->v[pos + 1], &s->v[pos], sizeof s->v[0] * (size_t)(s->n - pos));
    s->v[pos] = c;
    s->n++;
}

static const uint32_t decimal_groups[] = {
    0x30,   0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6,
    0x0C66, 0x0CE6, 0x0D66, 0x0DE6, 0x0E50, 0x0ED0, 0x0F20, 0x1040, 0x1090, 0x17E0,
    0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90, 0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620,
    0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10};

static int gcd(int a, int b)
{
    return b == 0 ? a : gcd(b, a % b);
}

static void analyse_integer(struct ctx *c, const uint32_t *pic, int n, struct ifmt *f)
{
    memset(f, 0, sizeof *f);
    f->primary = P_DECIMAL;
    f->tcase = C_LOWER;
    int semi = -1;
    for (int i = 0; i < n; i++)
        if (pic[i] == ';')
            semi = i;
    int pn = n;
    if (semi >= 0) {
        pn = semi;
        if (semi + 1 < n && pic[semi + 1] == 'o')
            f->ordinal = 1;
    }
    if (pn == 1 && (pic[0] == 'A' || pic[0] == 'a')) {
        f->primary = P_LETTERS;
        f->tcase = pic[0] == 'A' ? C_UPPER : C_LOWER;
        return;
    }
    if (pn == 1 && (pic[0] == 'I' || pic[0] == 'i')) {
        f->primary = P_ROMAN;
        f->tcase = pic[0] == 'I' ? C_UPPER : C_LOWER;
        return;
    }
    if (pn == 1 && pic[0] == 'W') {
        f->primary = P_WORDS;
        f->tcase = C_UPPER;
        return;
    }
    if (pn == 2 && pic[0] == 'W' && pic[1] == 'w') {
        f->primary = P_WORDS;
        f->tcase = C_TITLE;
        return;
    }
    if (pn == 1 && pic[0] == 'w') {
        f->primary = P_WORDS;
        return;
    }
    int have_zero = 0, seppos = 0;
    struct sep seps[32];
    int ns = 0;
    for (int i = pn - 1; i >= 0; i--) {
        uint32_t cp = pic[i];
        int digit = 0;
        for (size_t g = 0; g < sizeof decimal_groups / sizeof decimal_groups[0]; g++) {
            uint32_t grp = decimal_groups[g];
            if (cp >= grp && cp <= grp + 9) {
                digit = 1;
                f->mandatory++;
                seppos++;
                if (!have_zero) {
                    f->zero = grp;
                    have_zero = 1;
                } else if (grp != f->zero) {
                    ethrow(c, "D3131", -1, NULL, NULL);
                }
                break;
            }
        }
        if (!digit) {
            if (cp == '#') {
                seppos++;
                f->optional++;
            } else if (ns < 32) {
                seps[ns].position = seppos;
                seps[ns].ch = cp;
                ns++;
            }
        }
    }
    if (f->mandatory == 0) {
        f->primary = P_SEQUENCE;
        return;
    }
    int regular = 0;
    if (ns > 0) {
        int same = 1;
        for (int i = 1; i < ns; i++)
            if (seps[i].ch != seps[0].ch)
                same = 0;
        if (same) {
            int factor = seps[0].position;
            for (int i = 1; i < ns; i++)
                factor = gcd(factor, seps[i].position);
            regular = factor;
            for (int k = 1; k <= ns && regular; k++) {
                int found = 0;
                for (int i = 0; i < ns; i++)
                    if (seps[i].position == k * factor)
                        found = 1;
                if (!found)
                    regular = 0;
            }
        }
    }
    if (regular > 0) {
        f->regular = 1;
        f->regpos = regular;
        f->regch = seps[0].ch;
    } else {
        memcpy(f->seps, seps, sizeof seps[0] * (size_t)ns);
        f->nseps = ns;
    }
}

static const char *const few[] = {"Zero",    "One",     "Two",       "Three",    "Four",
                                  "Five",    "Six",     "Seven",     "Eight",    "Nine",
                                  "Ten",     "Eleven",  "Twelve",    "Thirteen", "Fourteen",
                                  "Fifteen", "Sixteen", "Seventeen", "Eighteen", "Nineteen"};
static const char *const ordinals[] = {
    "Zeroth",     "First",     "Second",    "Third",       "Fourth",     "Fifth",     "Sixth",
    "Seventh",    "Eighth",    "Ninth",     "Tenth",       "Eleventh",   "Twelfth",   "Thirteenth",
    "Fourteenth", "Fifteenth", "Sixteenth", "Seventeenth", "Eighteenth", "Nineteenth"};
static const char *const decades[] = {"Twenty",  "Thirty", "Forty",  "Fifty",  "Sixty",
                                      "Seventy", "Eighty", "Ninety", "Hundred"};
static const char *const magnitudes[] = {"Thousand", "Million", "Billion", "Trillion"};

static void words(struct cps *o, double num, int prev, int ord, int depth)
{
    if (depth > 40)
        return;
    if (num <= 19) {
        if (prev)
            cps_str(o, " and ");
        cps_str(o, ord ? ordinals[(int)num] : few[(int)num]);
    } else if (num < 100) {
        int tens = (int)floor(num / 10), rem = (int)fmod(num, 10);
        if (prev)
            cps_str(o, " and ");
        cps_str(o, decades[tens - 2]);
        if (rem > 0) {
            cps_add(o, '-');
            words(o, rem, 0, ord, depth + 1);
        } else if (ord) {
            o->n--; /* drop the trailing 'y' */
            cps_str(o, "ieth");
        }
    } else if (num < 1000) {
        int hundreds = (int)floor(num / 100);
        double rem = fmod(num, 100);
        if (prev)
            cps_str(o, ", ");
        cps_str(o, few[hundreds]);
        cps_str(o, " Hundred");
        if (rem > 0)
            words(o, rem, 1, ord, depth + 1);
        else if (ord)
            cps_str(o, "th");
    } else {
        int mag = (int)floor(log10(num) / 3);
        if (mag > 4)
            mag = 4;
        double factor = pow(10, mag * 3);
        double mant = floor(num / factor);
        double rem = num - mant * factor;
        if (prev)
            cps_str(o, ", ");
        words(o, mant, 0, 0, depth + 1);
        cps_add(o, ' ');
        cps_str(o, magnitudes[mag - 1]);
        if (rem > 0)
            words(o, rem, 1, ord, depth + 1);
        else if (ord)
            cps_str(o, "th");
    }
}

static void format_int(struct ctx *c, double value, struct ifmt *f, struct cps *o)
{
    if (!isfinite(value)) /* NaN or an infinite intermediate, e.g. $n/0 passed in */
        ethrow(c, "D1001", -1, NULL, NULL);
    o->n = 0;
    int neg = value < 0;
    value = fabs(value);
    struct cps r = {.n = 0};
    switch (f->primary) {
    case P_LETTERS: {
        uint32_t a = f->tcase == C_UPPER ? 'A' : 'a';
        struct cps t = {.n = 0};
        while (value > 0 && t.n < 64) {
            cps_add(&t, (uint32_t)fmod(value - 1, 26) + a);
            value = floor((value - 1) / 26);
        }
        for (int i = t.n - 1; i >= 0; i--)
            cps_add(&r, t.v[i]);
        break;
    }
    case P_ROMAN: {
        static const struct {
            int v;
            const char *s;
        } rn[] = {{1000, "m"}, {900, "cm"}, {500, "d"}, {400, "cd"}, {100, "c"},
                  {90, "xc"},  {50, "l"},   {40, "xl"}, {10, "x"},   {9, "ix"},
                  {5, "v"},    {4, "iv"},   {1, "i"}};
        if (value > 100000)
            ethrow(c, "D3130", -1, NULL, "number too large for roman numerals");
        int v = (int)value;
        for (int i = 0; i < 13; i++)
            while (v >= rn[i].v) {
                cps_str(&r, rn[i].s);
                v -= rn[i].v;
            }
        if (f->tcase == C_UPPER)
            for (int i = 0; i < r.n; i++)
                r.v[i] -= 32;
        break;
    }
    case P_WORDS:
        if (value >= 1e60)
            ethrow(c, "D3130", -1, NULL, "number too large for words");
        words(&r, value, 0, f->ordinal, 0);
        for (int i = 0; i < r.n; i++) {
            if (f->tcase == C_UPPER && r.v[i] >= 'a' && r.v[i] <= 'z')
                r.v[i] -= 32;
            else if (f->tcase == C_LOWER && r.v[i] >= 'A' && r.v[i] <= 'Z')
                r.v[i] += 32;
        }
        break;
    case P_DECIMAL: {
        char digits[400];
        snprintf(digits, sizeof digits, "%.0f", value);
        int dl = (int)strlen(digits);
        for (int i = dl; i < f->mandatory; i++)
            cps_add(&r, '0');
        for (int i = 0; i < dl; i++)
            cps_add(&r, (uint32_t)digits[i]);
        if (f->zero != '0')
            for (int i = 0; i < r.n; i++)
                r.v[i] = r.v[i] - '0' + f->zero;
        if (f->regular) {
            int k = (r.n - 1) / f->regpos;
            for (int ii = k; ii > 0; ii--)
                cps_insert(&r, r.n - ii * f->regpos, f->regch);
        } else {
            for (int i = f->nseps - 1; i >= 0; i--)
                cps_insert(&r, r.n - f->seps[i].position, f->seps[i].ch);
        }
        if (f->ordinal) {
            uint32_t last = r.v[r.n - 1];
            const char *suf = last == '1' ? "st" : last == '2' ? "nd" : last == '3' ? "rd" : "th";
            if (r.n > 1 && r.v[r.n - 2] == '1')
                suf = "th";
            cps_str(&r, suf);
        }
        break;
    }
    default:
        ethrow(c, "D3130", -1, NULL, NULL);
    }
    if (neg)
        cps_add(o, '-');
    for (int i = 0; i < r.n; i++)
        cps_add(o, r.v[i]);
}

static val *cps_val(struct ctx *c, const struct cps *s)
{
    struct sb b = {0};
    sb_add(c, &b, "", 0);
    for (int i = 0; i < s->n; i++)
        sb_addcp(c, &b, s->v[i]);
    return sb_val(c, &b);
}

static int to_cps(val *s, uint32_t *out, int max)
{
    int n = 0;
    size_t i = 0;
    while (s && i < s->n && n < max)
        out[n++] = utf8_next(s->u.s, s->n, &i);
    return n;
}

val *fn_formatInteger(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *v = ARG(0), *p = ARG(1);
    if (!v)
        return NULL;
    if (!p) /* an undefined picture (the reference fails with a TypeError) */
        ethrow(c, "T0410", -1, "formatInteger", "argument 2");
    uint32_t pic[CP_MAX];
    int pn = to_cps(p, pic, CP_MAX);
    struct ifmt f;
    analyse_integer(c, pic, pn, &f);
    struct cps *o = cx_alloc(c, sizeof *o);
    format_int(c, floor(v->u.num), &f, o);
    return cps_val(c, o);
}

/* ---- date/time ---- */

struct marker {
    int literal;
    struct cps lit;
    uint32_t comp;
    int names;      /* 0 none, 1 lower, 2 upper, 3 title */
    int wmin, wmax; /* -1 when absent */
    uint32_t pres2;
    int n; /* year digits */
    struct ifmt fmt;
    int has_fmt;
};

static const char *const day_names[] = {"",         "Monday", "Tuesday",  "Wednesday",
                                        "Thursday", "Friday", "Saturday", "Sunday"};
static const char *const month_names[] = {"January",   "February", "March",    "April",
                                          "May",       "June",     "July",     "August",
                                          "September", "October",  "November", "December"};

static long long days_civil(long long y, int m, int d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static void civil(long long z, long long *y, int *m, int *d)
{
    z += 719468;
    long long era = (z >= 0 ? z : z - 146096) / 146097;
    long long doe = z - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long long mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

/* Date.UTC(year, month0) in ms; month0 may be 12 or -1 */
static double utc_ym(long long y, int m0)
{
    while (m0 > 11) {
        m0 -= 12;
        y++;
    }
    while (m0 < 0) {
        m0 += 12;
        y--;
    }
    return (double)days_civil(y, m0 + 1, 1) * 86400000.0;
}

static double start_first_week(long long y, int m0)
{
    double jan1 = utc_ym(y, m0);
    long long dd = (long long)floor(jan1 / 86400000.0);
    int dow = (int)(((dd + 4) % 7 + 7) % 7);
    if (dow == 0)
        dow = 7;
    return dow > 4 ? jan1 + (8 - dow) * 86400000.0 : jan1 - (dow - 1) * 86400000.0;
}

static void add_literal(const uint32_t *p, int s0, int e0, struct marker *ms, int *nm, int max)
{
    if (e0 <= s0 || *nm >= max)
        return;
    struct marker *L = &ms[(*nm)++];
    memset(L, 0, sizeof *L);
    L->literal = 1;
    for (int q = s0; q < e0; q++) {
        cps_add(&L->lit, p[q]);
        if (p[q] == ']' && q + 1 < e0 && p[q + 1] == ']')
            q++;
    }
}

/* Widths saturate here: far wider than any formatted part can be (parts
 * are cut at CP_MAX code points), and no digit string can overflow. */
#define WIDTH_MAX (1 << 20)

static int parse_width(const uint32_t *mk, int from, int to)
{
    if (to <= from || (to - from == 1 && mk[from] == '*'))
        return -1;
    int v = 0;
    for (int q = from; q < to && mk[q] >= '0' && mk[q] <= '9'; q++)
        if ((v = v * 10 + (int)(mk[q] - '0')) > WIDTH_MAX)
            v = WIDTH_MAX;
    return v;
}

static void parse_pictures(struct ctx *c, const uint32_t *p, int n, struct marker *ms, int *nm,
                           int max)
{
    int start = 0, pos = 0;
    *nm = 0;
    while (pos < n) {
        if (p[pos] == '[') {
            if (pos + 1 < n && p[pos + 1] == '[') {
                add_literal(p, start, pos, ms, nm, max);
                if (*nm < max) {
                    struct marker *L = &ms[(*nm)++];
                    memset(L, 0, sizeof *L);
                    L->literal = 1;
                    cps_add(&L->lit, '[');
                }
                pos += 2;
                start = pos;
                continue;
            }
            add_literal(p, start, pos, ms, nm, max);
            start = pos;
            int close = -1;
            for (int q = start; q < n; q++)
                if (p[q] == ']') {
                    close = q;
                    break;
                }
            if (close < 0)
                ethrow(c, "D3135", -1, NULL, NULL);
            pos = close;
            uint32_t mk[CP_MAX];
            int ml = 0;
            for (int q = start + 1; q < pos; q++)
                if (p[q] != ' ' && p[q] != '\t' && p[q] != '\n' && p[q] != '\r')
                    mk[ml++] = p[q];
            if (*nm >= max || ml == 0)
                ethrow(c, "D3132", -1, NULL, NULL);
            struct marker *d = &ms[(*nm)++];
            memset(d, 0, sizeof *d);
            d->comp = mk[0];
            d->wmin = d->wmax = -1;
            int comma = -1;
            for (int q = 0; q < ml; q++)
                if (mk[q] == ',')
                    comma = q;
            int pe = ml;
            if (comma >= 0) {
                pe = comma;
                int dash = -1;
                for (int q = comma + 1; q < ml; q++)
                    if (mk[q] == '-') {
                        dash = q;
                        break;
                    }
                d->wmin = parse_width(mk, comma + 1, dash >= 0 ? dash : ml);
                if (dash >= 0)
                    d->wmax = parse_width(mk, dash + 1, ml);
            }
            uint32_t pres[CP_MAX];
            int pl = 0;
            for (int q = 1; q < pe; q++)
                pres[pl++] = mk[q];
            if (pl > 1 && (pres[pl - 1] == 'a' || pres[pl - 1] == 't' || pres[pl - 1] == 'c' ||
                           pres[pl - 1] == 'o')) {
                d->pres2 = pres[pl - 1];
                pl--;
            }
            if (pl == 0) {
                const char *def = NULL;
                switch (d->comp) {
                case 'Y':
                case 'M':
                case 'D':
                case 'd':
                case 'W':
                case 'w':
                case 'X':
                case 'x':
                case 'H':
                case 'h':
                case 'f':
                    def = "1";
                    break;
                case 'F':
                case 'P':
                case 'C':
                case 'E':
                    def = "n";
                    break;
                case 'm':
                case 's':
                    def = "01";
                    break;
                case 'Z':
                case 'z':
                    def = "01:01";
                    break;
                default:
                    break;
                }
                if (!def)
                    ethrow(c, "D3132", -1, NULL, NULL);
                while (*def)
                    pres[pl++] = (unsigned char)*def++;
            }
            if (pres[0] == 'n')
                d->names = 1;
            else if (pres[0] == 'N')
                d->names = pl > 1 && pres[1] == 'n' ? 3 : 2;
            else if (d->comp < 128 && strchr("YMDdFWwXxHhmsf", (int)d->comp)) {
                uint32_t ip[CP_MAX];
                int il = 0;
                for (int q = 0; q < pl && il < CP_MAX - 2; q++)
                    ip[il++] = pres[q];
                if (d->pres2) {
                    ip[il++] = ';';
                    ip[il++] = d->pres2;
                }
                analyse_integer(c, ip, il, &d->fmt);
                d->has_fmt = 1;
                if (d->wmin >= 0 && d->fmt.mandatory < d->wmin)
                    d->fmt.mandatory = d->wmin;
                if (d->comp == 'Y') {
                    d->n = -1;
                    if (d->wmax >= 0) {
                        d->n = d->wmax;
                        d->fmt.mandatory = d->n;
                    } else {
                        int w = d->fmt.mandatory + d->fmt.optional;
                        if (w >= 2)
                            d->n = w;
                    }
                }
            }
            if (d->comp == 'Z' || d->comp == 'z') {
                analyse_integer(c, pres, pl, &d->fmt);
                d->has_fmt = 1;
            }
            if (!d->has_fmt && !d->names && !(d->comp < 128 && strchr("PCE", (int)d->comp)))
                ethrow(c, "D3132", -1, NULL, NULL);
            start = pos + 1;
        }
        pos++;
    }
    add_literal(p, start, pos, ms, nm, max);
}

val *expr_format_datetime(struct ctx *c, double ms, val *picture, val *tz)
{
    int offh = 0, offm = 0;
    if (tz) {
        char t[32];
        size_t l = tz->n < 31 ? tz->n : 31;
        memcpy(t, tz->u.s, l);
        t[l] = 0;
        long off = strtol(t, NULL, 10);
        /* "±HHMM": anything longer is nonsense; kept in range so the hour
         * fits an int */
        if (off > 9999)
            off = 9999;
        if (off < -9999)
            off = -9999;
        offh = (int)floor((double)off / 100);
        offm = (int)(off % 100);
    }
    uint32_t pic[CP_MAX];
    int pn;
    if (picture) {
        pn = to_cps(picture, pic, CP_MAX);
    } else {
        const char *iso = "[Y0001]-[M01]-[D01]T[H01]:[m01]:[s01].[f001][Z01:01t]";
        pn = 0;
        while (iso[pn]) {
            pic[pn] = (unsigned char)iso[pn];
            pn++;
        }
    }
    struct marker *mks = cx_alloc(c, sizeof *mks * 64);
    int nm;
    parse_pictures(c, pic, pn, mks, &nm, 64);
    double t = ms + (double)((60 * offh + offm) * 60 * 1000);
    if (!isfinite(t) || fabs(t) > 8.64e15)
        ethrow(c, "D3110", -1, NULL, NULL);
    double days = floor(t / 86400000.0);
    long long y;
    int mo, d;
    civil((long long)days, &y, &mo, &d);
    double rem = t - days * 86400000.0;
    int hh = (int)(rem / 3600000), mi = (int)fmod(rem / 60000, 60), ss = (int)fmod(rem / 1000, 60),
        msec = (int)fmod(rem, 1000);
    int dow = (int)((((long long)days + 4) % 7 + 7) % 7);
    struct cps *out = cx_alloc(c, sizeof *out);
    struct cps *part = cx_alloc(c, sizeof *part);
    struct cps *pre = cx_alloc(c, sizeof *pre);
    out->n = 0;
    for (int k = 0; k < nm; k++) {
        struct marker *m = &mks[k];
        if (m->literal) {
            for (int i = 0; i < m->lit.n; i++)
                cps_add(out, m->lit.v[i]);
            continue;
        }
        double v = 0;
        const char *name = NULL;
        double today = days * 86400000.0;
        switch (m->comp) {
        case 'Y':
            v = (double)y;
            break;
        case 'M':
            v = mo;
            break;
        case 'D':
            v = d;
            break;
        case 'd':
            v = days - (double)days_civil(y, 1, 1) + 1;
            break;
        case 'F':
            v = dow == 0 ? 7 : dow;
            break;
        case 'W': {
            double s1 = start_first_week(y, 0);
            double week = (today - s1) / (86400000.0 * 7) + 1;
            if (week > 52) {
                if (today >= start_first_week(y + 1, 0))
                    week = 1;
            } else if (week < 1) {
                week = (today - start_first_week(y - 1, 0)) / (86400000.0 * 7) + 1;
            }
            v = floor(week);
            break;
        }
        case 'w': {
            double s1 = start_first_week(y, mo - 1);
            double week = (today - s1) / (86400000.0 * 7) + 1;
            if (week > 4) {
                if (today >= start_first_week(y, mo))
                    week = 1;
            } else if (week < 1) {
                week = (today - start_first_week(y, mo - 2)) / (86400000.0 * 7) + 1;
            }
            v = floor(week);
            break;
        }
        case 'X': {
            double s = start_first_week(y, 0), e = start_first_week(y + 1, 0);
            v = t < s ? (double)y - 1 : t >= e ? (double)y + 1 : (double)y;
            break;
        }
        case 'x': {
            double s = start_first_week(y, mo - 1), e = start_first_week(y, mo);
            int pm = mo - 1 == 0 ? 12 : mo - 1, nmn = mo == 12 ? 1 : mo + 1;
            v = t < s ? pm : t >= e ? nmn : mo;
            break;
        }
        case 'H':
            v = hh;
            break;
        case 'h':
            v = hh % 12 == 0 ? 12 : hh % 12;
            break;
        case 'P':
            name = hh >= 12 ? "pm" : "am";
            break;
        case 'm':
            v = mi;
            break;
        case 's':
            v = ss;
            break;
        case 'f':
            v = msec;
            break;
        case 'C':
        case 'E':
            name = "ISO";
            break;
        default:
            break;
        }
        part->n = 0;
        if (m->comp < 128 && strchr("YMDdFWwXxHhms", (int)m->comp)) {
            if (m->comp == 'Y' && m->n != -1)
                v = fmod(v, pow(10, m->n));
            if (m->names) {
                if (m->comp == 'M' || m->comp == 'x')
                    name = month_names[(int)v - 1];
                else if (m->comp == 'F')
                    name = day_names[(int)v];
                else
                    ethrow(c, "D3133", -1, NULL, NULL);
                for (const char *q = name; *q; q++) {
                    uint32_t ch = (unsigned char)*q;
                    if (m->names == 2 && ch >= 'a' && ch <= 'z')
                        ch -= 32;
                    else if (m->names == 1 && ch >= 'A' && ch <= 'Z')
                        ch += 32;
                    cps_add(part, ch);
                }
                if (m->wmax >= 0 && part->n > m->wmax)
                    part->n = m->wmax;
            } else {
                format_int(c, v, &m->fmt, part);
            }
        } else if (m->comp == 'f') {
            format_int(c, v, &m->fmt, part);
        } else if (m->comp == 'Z' || m->comp == 'z') {
            int offset = offh * 100 + offm;
            if (m->fmt.regular) {
                format_int(c, offset, &m->fmt, part);
            } else {
                int nd = m->fmt.mandatory;
                if (nd == 1 || nd == 2) {
                    format_int(c, offh, &m->fmt, part);
                    if (offm != 0) {
                        cps_add(part, ':');
                        char t2[16];
                        snprintf(t2, sizeof t2, "%02d", abs(offm));
                        cps_str(part, t2);
                    }
                } else if (nd == 3 || nd == 4) {
                    format_int(c, offset, &m->fmt, part);
                } else {
                    ethrow(c, "D3134", -1, NULL, NULL);
                }
            }
            pre->n = 0;
            if (m->comp == 'z')
                cps_str(pre, "GMT");
            if (offset >= 0)
                cps_add(pre, '+');
            for (int i = 0; i < part->n; i++)
                cps_add(pre, part->v[i]);
            memcpy(part, pre, sizeof *part);
            if (offset == 0 && m->pres2 == 't') {
                part->n = 0;
                cps_add(part, 'Z');
            }
        } else if (m->comp == 'P') {
            for (const char *q = name; *q; q++)
                cps_add(part, m->names == 2 ? (uint32_t)(*q - 32) : (uint32_t)*q);
        } else if (name) {
            cps_str(part, name);
        }
        for (int i = 0; i < part->n; i++)
            cps_add(out, part->v[i]);
    }
    return cps_val(c, out);
}

static int match_name(const uint32_t *in, int n, int pos, const char *const *names, int count,
                      int *len)
{
    for (int k = 0; k < count; k++) {
        const char *nm = names[k];
        int l = (int)strlen(nm), j = 0;
        while (j < l && pos + j < n) {
            uint32_t a = in[pos + j], b = (unsigned char)nm[j];
            if ((a | 0x20) != (b | 0x20))
                break;
            j++;
        }
        if (j == l || (j >= 3 && (pos + j >= n ||
                                  !((in[pos + j] | 0x20) >= 'a' && (in[pos + j] | 0x20) <= 'z')))) {
            *len = j;
            return k;
        }
    }
    return -1;
}

/* A subset of the reference's parseDateTime: decimal components, month and
 * day names, am/pm and literals.  Returns undefined when the text does not
 * match the picture. */
val *expr_parse_datetime(struct ctx *c, val *s, val *picture)
{
    uint32_t pic[CP_MAX], in[CP_MAX];
    int pn = to_cps(picture, pic, CP_MAX), n = to_cps(s, in, CP_MAX);
    struct marker *mks = cx_alloc(c, sizeof *mks * 64);
    int nm;
    parse_pictures(c, pic, pn, mks, &nm, 64);
    double comp[128];
    int have[128] = {0};
    int pos = 0;
    for (int k = 0; k < nm; k++) {
        struct marker *m = &mks[k];
        if (m->literal) {
            for (int i = 0; i < m->lit.n; i++, pos++)
                if (pos >= n || in[pos] != m->lit.v[i])
                    return NULL;
            continue;
        }
        uint32_t cc = m->comp < 128 ? m->comp : 0;
        if (m->names && (cc == 'M' || cc == 'x' || cc == 'F')) {
            int l = 0;
            int idx = cc == 'F' ? match_name(in, n, pos, day_names + 1, 7, &l)
                                : match_name(in, n, pos, month_names, 12, &l);
            if (idx < 0)
                return NULL;
            comp[cc] = idx + 1;
            have[cc] = 1;
            pos += l;
            continue;
        }
        if (cc == 'P') {
            if (pos + 1 < n && (in[pos + 1] | 0x20) == 'm' &&
                ((in[pos] | 0x20) == 'a' || (in[pos] | 0x20) == 'p')) {
                comp['P'] = (in[pos] | 0x20) == 'p';
                have['P'] = 1;
                pos += 2;
                continue;
            }
            return NULL;
        }
        if (!m->has_fmt || m->fmt.primary != P_DECIMAL || cc == 'Z' || cc == 'z')
            ethrow(c, "D3137", -1, NULL, "this $toMillis() picture is not supported");
        int next_is_marker = k + 1 < nm && !mks[k + 1].literal;
        int width = next_is_marker ? m->fmt.mandatory : 1 << 20;
        double v = 0;
        int got = 0;
        while (pos < n && got < width && in[pos] >= m->fmt.zero && in[pos] <= m->fmt.zero + 9) {
            v = v * 10 + (in[pos] - m->fmt.zero);
            pos++;
            got++;
        }
        if (!got)
            return NULL;
        comp[cc] = v;
        have[cc] = 1;
    }
    if (pos != n)
        return NULL;
    if ((have['M'] && !have['Y'] && have['D']) || (!have['M'] && have['Y'] && have['D']))
        ethrow(c, "D3136", -1, NULL, NULL);
    double y = have['Y'] ? comp['Y'] : 1970;
    double mo = have['M'] ? comp['M'] : 1, d = have['D'] ? comp['D'] : 1;
    double h = have['H'] ? comp['H'] : 0;
    if (have['h']) {
        h = fmod(comp['h'], 12);
        if (have['P'] && comp['P'])
            h += 12;
    }
    double days;
    if (have['d'] && !have['M'])
        days = (double)days_civil((long long)y, 1, 1) + comp['d'] - 1;
    else
        days = (double)days_civil((long long)y, (int)mo, 1) + d - 1;
    double ms = days * 86400000.0 + h * 3600000.0 + (have['m'] ? comp['m'] : 0) * 60000.0 +
                (have['s'] ? comp['s'] : 0) * 1000.0 + (have['f'] ? comp['f'] : 0);
    return mknum(c, ms);
}

val *fn_formatNumber(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    ethrow(c, "D3137", -1, NULL, "$formatNumber() is not supported");
}

val *fn_parseInteger(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    ethrow(c, "D3137", -1, NULL, "$parseInteger() is not supported");
}
