/* json — implementation pending (see json.h). */
#include "json/json.h"
