/*
 * errors — the JSONata error catalogue and the evaluator's throw.
 *
 * Messages follow the reference implementation's templates; %t marks the
 * token and %v a value.  Messages never contain input data beyond a short
 * token, so they are safe to log.
 */
#include <stdarg.h>
#include <stdio.h>

#include "expr/expr_int.h"

static const struct {
    const char *code;
    const char *msg;
} catalogue[] = {
    {"S0101", "String literal must be terminated by a matching quote"},
    {"S0102", "Number out of range: %t"},
    {"S0103", "Unsupported escape sequence: \\%t"},
    {"S0104", "The escape sequence \\u must be followed by 4 hex digits"},
    {"S0105", "Quoted property name must be terminated with a backquote (`)"},
    {"S0106", "Comment has no closing tag"},
    {"S0201", "Syntax error: %t"},
    {"S0202", "Expected %v, got %t"},
    {"S0203", "Expected %v before end of expression"},
    {"S0204", "Unknown operator: %t"},
    {"S0205", "Unexpected token: %t"},
    {"S0206", "Unknown expression type: %t"},
    {"S0207", "Unexpected end of expression"},
    {"S0208", "Parameter %v of function definition must be a variable name (start with $)"},
    {"S0209", "A predicate cannot follow a grouping expression in a step"},
    {"S0210", "Each step can only have one grouping expression"},
    {"S0211", "The symbol %t cannot be used as a unary operator"},
    {"S0212", "The left side of := must be a variable name (start with $)"},
    {"S0213", "The literal value %v cannot be used as a step within a path expression"},
    {"S0214", "The right side of %t must be a variable name (start with $)"},
    {"S0215", "A context variable binding must precede any predicates on a step"},
    {"S0216", "A context variable binding must precede the 'order-by' clause on a step"},
    {"S0217", "The object representing the 'parent' cannot be derived from this expression"},
    {"S0301", "Empty regular expressions are not allowed"},
    {"S0302", "No terminating / in regular expression"},
    /* Ours: the reference leaves these to JavaScript's RegExp */
    {"S0303", "Invalid regular expression"},
    {"S0304", "Regular expression too large to compile (a repetition count above 1000, groups "
              "nested deeper than 200 or a program of more than 20000 instructions)"},
    {"S0402", "Choice groups containing parameterized types are not supported"},
    {"S0401", "Type parameters can only be applied to functions and arrays"},
    {"S0500", "Attempted to evaluate an expression containing syntax error(s)"},
    {"T0410", "Argument %v of function %t does not match function signature"},
    {"T0411", "Context value is not a compatible type with argument %v of function %t"},
    {"T0412", "Argument %v of function %t must be an array of %v"},
    {"D1001", "Number out of range: %v"},
    {"D1002", "Cannot negate a non-numeric value: %v"},
    {"T1003", "Key in object structure must evaluate to a string; got: %v"},
    {"D1004", "Regular expression matches zero length string"},
    {"T1005", "Attempted to invoke a non-function. Did you mean $%t?"},
    {"T1006", "Attempted to invoke a non-function"},
    {"T1007", "Attempted to partially apply a non-function. Did you mean $%t?"},
    {"T1008", "Attempted to partially apply a non-function"},
    {"D1009", "Multiple key definitions evaluate to same key: %v"},
    {"T1010", "The matcher function argument passed to function %t does not return the correct "
              "object structure"},
    {"D1011", "Stack overflow. Check for non-terminating recursive function.  Consider rewriting "
              "as tail-recursive"},
    {"D1012", "Evaluation timeout after %v milliseconds. Check for infinite loop"},
    {"D1013", "Object property names starting with _jsonata_ are reserved for internal use: %v"},
    {"T2001", "The left side of the %t operator must evaluate to a number"},
    {"T2002", "The right side of the %t operator must evaluate to a number"},
    {"T2003", "The left side of the range operator (..) must evaluate to an integer"},
    {"T2004", "The right side of the range operator (..) must evaluate to an integer"},
    {"D2005", "The left side of := must be a variable name (start with $)"},
    {"T2006", "The right side of the function application operator ~> must be a function"},
    {"T2007", "Type mismatch when comparing values %v and %v in order-by clause"},
    {"T2008",
     "The expressions within an order-by clause must evaluate to numeric or string values"},
    {"T2009", "The values %v and %v either side of operator %t must be of the same data type"},
    {"T2010",
     "The expressions either side of operator %t must evaluate to numeric or string values"},
    {"T2011",
     "The insert/update clause of the transform expression must evaluate to an object: %v"},
    {"T2012", "The delete clause of the transform expression must evaluate to a string or array of "
              "strings: %v"},
    {"T2013", "The transform expression clones the input object using the $clone() function.  This "
              "has been overridden in the current scope by a non-function."},
    {"D2014", "The size of the sequence allocated by the range operator (..) must not exceed 1e7.  "
              "Attempted to allocate %v."},
    {"D2015", "The maximum sequence length of %v was exceeded."},
    {"D3001", "Attempting to invoke string function on Infinity or NaN"},
    {"D3010", "Second argument of replace function cannot be an empty string"},
    {"D3011", "Fourth argument of replace function must evaluate to a positive number"},
    {"D3012", "Attempted to replace a matched string with a non-string value"},
    {"D3020", "Third argument of split function must evaluate to a positive number"},
    {"D3030", "Unable to cast value to a number: %v"},
    {"D3040", "Third argument of match function must evaluate to a positive number"},
    {"D3050",
     "The second argument of reduce function must be a function with at least two arguments"},
    {"D3060", "The sqrt function cannot be applied to a negative number: %v"},
    {"D3061", "The power function has resulted in a value that cannot be represented as a JSON "
              "number: base=%v, exponent=%v"},
    {"D3070",
     "The single argument form of the sort function can only be applied to an array of strings or "
     "an array of numbers.  Use the second argument to specify a comparison function"},
    {"D3080", "The picture string must only contain a maximum of two sub-pictures"},
    {"D3081", "The sub-picture must not contain more than one instance of the 'decimal-separator' "
              "character"},
    {"D3082", "The sub-picture must not contain more than one instance of the 'percent' character"},
    {"D3083",
     "The sub-picture must not contain more than one instance of the 'per-mille' character"},
    {"D3084", "The sub-picture must not contain both a 'percent' and a 'per-mille' character"},
    {"D3085", "The mantissa part of a sub-picture must contain at least one character that is "
              "either an 'optional digit character' or a member of the 'decimal digit family'"},
    {"D3086", "The sub-picture must not contain a passive character that is preceded by an active "
              "character and that is followed by another active character"},
    {"D3087", "The sub-picture must not contain a 'grouping-separator' character that appears "
              "adjacent to a 'decimal-separator' character"},
    {"D3088",
     "The sub-picture must not contain a 'grouping-separator' at the end of the integer part"},
    {"D3089", "The sub-picture must not contain two adjacent instances of the 'grouping-separator' "
              "character"},
    {"D3090", "The integer part of the sub-picture must not contain a member of the 'decimal digit "
              "family' that is followed by an instance of the 'optional digit character'"},
    {"D3091",
     "The fractional part of the sub-picture must not contain an instance of the 'optional digit "
     "character' that is followed by a member of the 'decimal digit family'"},
    {"D3092", "A sub-picture that contains a 'percent' or 'per-mille' character must not contain a "
              "character treated as an 'exponent-separator'"},
    {"D3093", "The exponent part of the sub-picture must comprise only of one or more characters "
              "that are members of the 'decimal digit family'"},
    {"D3100", "The radix of the formatBase function must be between 2 and 36.  It was given %v"},
    {"D3110",
     "The argument of the toMillis function must be an ISO 8601 formatted timestamp. Given %v"},
    {"D3120", "Syntax error in expression passed to function eval: %v"},
    {"D3121", "Dynamic error evaluating the expression passed to function eval: %v"},
    {"D3130", "Formatting or parsing an integer as a sequence starting with %v is not supported by "
              "this implementation"},
    {"D3131", "In a decimal digit pattern, all digits must be from the same decimal group"},
    {"D3132", "Unknown component specifier %v in date/time picture string"},
    {"D3133", "The 'name' modifier can only be applied to months and days in the date/time picture "
              "string, not %v"},
    {"D3134", "The timezone integer format specifier cannot have more than four digits"},
    {"D3135", "No matching closing bracket ']' in date/time picture string"},
    {"D3136", "The date/time picture string is missing specifiers required to parse the timestamp"},
    {"D3137", "%s"},
    {"D3138",
     "The $single() function expected exactly 1 matching result.  Instead it matched more."},
    {"D3139", "The $single() function expected exactly 1 matching result.  Instead it matched 0."},
    {"D3140", "Malformed URL passed to %v(): %v"},
    {"D3141", "%s"},
    {"U1001", "Stack overflow error: Check for non-terminating recursive function.  Consider "
              "rewriting as tail-recursive."},
    {NULL, NULL},
};

static const char *lookup_msg(const char *code)
{
    for (int i = 0; catalogue[i].code; i++)
        if (!strcmp(catalogue[i].code, code))
            return catalogue[i].msg;
    return "Error";
}

/* Expands the template of code into out: %t the token, %v "value", %s detail. */
static void expand(const char *code, const char *token, const char *detail, char *out, size_t n)
{
    const char *t = lookup_msg(code);
    size_t o = 0;
    for (; *t && o + 1 < n; t++) {
        if (t[0] == '%' && (t[1] == 't' || t[1] == 'v' || t[1] == 's')) {
            const char *ins = t[1] == 't'   ? (token ? token : "")
                              : t[1] == 's' ? (detail ? detail : "")
                                            : "value";
            int w = snprintf(out + o, n - o, "%s", ins);
            if (w > 0)
                o += (size_t)w < n - o ? (size_t)w : n - o - 1;
            t++;
            continue;
        }
        out[o++] = *t;
    }
    out[o] = 0;
}

void ecode_msg(const char *code, char *out, size_t n)
{
    expand(code, NULL, NULL, out, n);
}

_Noreturn void ethrow(struct ctx *c, const char *code, int pos, const char *token, const char *fmt,
                      ...)
{
    struct expr_error *e = c->err;
    if (e) {
        memset(e, 0, sizeof *e);
        snprintf(e->code, sizeof e->code, "%s", code);
        e->position = pos;
        if (token)
            snprintf(e->token, sizeof e->token, "%s", token);
        char detail[200] = "";
        if (fmt) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(detail, sizeof detail, fmt, ap);
            va_end(ap);
        }
        /* The limits' codes name several causes (a stack too deep, a time
         * limit, a memory cap): the detail says which, alone */
        int limit = strcmp(code, "U1001") == 0 || strcmp(code, "U1002") == 0;
        if (limit && detail[0]) {
            snprintf(e->msg, sizeof e->msg, "%s", detail);
        } else if (strstr(lookup_msg(code), "%s")) {
            expand(code, token, detail, e->msg, sizeof e->msg);
        } else {
            expand(code, token, NULL, e->msg, sizeof e->msg);
            if (fmt && detail[0]) {
                size_t l = strlen(e->msg);
                snprintf(e->msg + l, sizeof e->msg - l, " (%s)", detail);
            }
        }
    }
    longjmp(c->jb, 1);
}
