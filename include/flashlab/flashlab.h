// Umbrella header of the public C++ API.
#pragma once

#include "flashlab/activation.h"
#include "flashlab/elementwise.h"
#include "flashlab/error.h"
#include "flashlab/norm.h"
#include "flashlab/reduce.h"
#include "flashlab/streams.h"
#include "flashlab/tensor.h"
#include "flashlab/validate.h"
