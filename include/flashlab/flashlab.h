// Umbrella header of the public C++ API.
#pragma once

#include "flashlab/activation.h"
#include "flashlab/elementwise.h"
#include "flashlab/error.h"
#include "flashlab/layernorm.h"
#include "flashlab/norm.h"
#include "flashlab/quant.h"
#include "flashlab/reduce.h"
#include "flashlab/rope.h"
#include "flashlab/serving.h"
#include "flashlab/softmax.h"
#include "flashlab/streams.h"
#include "flashlab/tensor.h"
#include "flashlab/validate.h"
